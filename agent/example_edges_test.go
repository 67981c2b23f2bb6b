package agent_test

import (
	"context"
	"fmt"
	"net"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

func ExampleClient_severalEdges() {
	// Two edges on loopback, for the example; the first is down.
	down, _ := net.Listen("tcp", "127.0.0.1:0")
	down.Close()
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	up, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.ServeAgents(up)

	// The client tries the edges in order, and moves on to the next one
	// whenever a session ends (in production: edges that share their names,
	// so that the URL stays the same).
	c := &agent.Client{
		Addrs: []string{down.Addr().String(), up.Addr().String()},
		OnEvent: func(e agent.Event) {
			if e.Kind == agent.Connected {
				fmt.Println("connected to the second edge:", e.Addr == up.Addr().String())
			}
		},
	}
	defer c.Close()
	l, err := c.Listen(context.Background(), "myapp")
	if err != nil {
		panic(err)
	}
	fmt.Println(l.URL())
	// Output:
	// connected to the second edge: true
	// http://myapp.example.test
}
