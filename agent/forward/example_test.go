package forward_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
)

func ExampleBytes() {
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	agents, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.ServeAgents(agents)

	// A local app on loopback, exposed as http://local.example.test.
	app, _ := net.Listen("tcp", "127.0.0.1:0")
	go http.Serve(app, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "local app")
	}))
	l, err := agent.Listen(context.Background(), agents.Addr().String(), "local")
	if err != nil {
		panic(err)
	}
	done := make(chan error)
	go func() { done <- forward.Bytes{To: app.Addr().String()}.Serve(l) }()
	fmt.Println(l.URL())
	l.Close()
	fmt.Println("Serve returned:", <-done)
	// Output:
	// http://local.example.test
	// Serve returned: <nil>
}

func ExampleHTTP() {
	// An edge on loopback, for the example.
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	agents, _ := net.Listen("tcp", "127.0.0.1:0")
	public, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.ServeAgents(agents)
	go srv.ServeHTTPListener(public)

	// The app, on loopback.
	app, _ := net.Listen("tcp", "127.0.0.1:0")
	go http.Serve(app, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "the app saw %s %s for %s", r.Method, r.URL, r.Header.Get("X-Forwarded-For"))
	}))
	l, err := agent.Listen(context.Background(), agents.Addr().String(), "http://shop")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go forward.HTTP{To: app.Addr().String()}.Serve(l) // a log line per request with a Logger

	// A client of the public URL (DNS for example.test points at the edge).
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, public.Addr().String())
		},
	}}
	resp, err := client.Get(l.URL() + "/cart?id=7")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(string(body))
	// Output: the app saw GET /cart?id=7 for 127.0.0.1
}
