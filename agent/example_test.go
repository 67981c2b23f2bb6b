package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

func ExampleListen() {
	// An edge on loopback, for the example.
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	agents, _ := net.Listen("tcp", "127.0.0.1:0")
	public, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.ServeAgents(agents)
	go srv.ServeHTTPListener(public)

	// The app: Listen returns a net.Listener for http.Serve.
	l, err := agent.Listen(context.Background(), agents.Addr().String(), "http://myapp")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "served through the tunnel")
	}))

	// A client of the public URL (DNS for example.test points at the edge).
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, public.Addr().String())
		},
	}}
	resp, err := client.Get(l.URL())
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(string(body))
	// Output: served through the tunnel
}
