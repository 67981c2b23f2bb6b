package inspect_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/agent/inspect"
	"github.com/tunnelkit/tunnelkit/edge"
)

func ExampleInspector() {
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
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order 1042")
	}))

	// The inspector: its page and API on loopback only (the example
	// agent's -inspect serves them on 127.0.0.1:4040), and the
	// forwarder's exchanges in it.
	insp := new(inspect.Inspector)
	ui, _ := net.Listen("tcp", "127.0.0.1:0")
	go http.Serve(ui, insp)
	l, err := agent.Listen(context.Background(), agents.Addr().String(), "http://shop")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go forward.HTTP{To: app.Addr().String(), Recorder: insp}.Serve(l)

	// A client of the public URL (DNS for example.test points at the edge).
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, public.Addr().String())
		},
	}}
	resp, err := client.Post(l.URL()+"/orders?notify=email", "application/json", strings.NewReader(`{"sku":"TK-001"}`))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	// What the page at http://127.0.0.1:4040/ shows; the Exchange's status
	// is known before the client gets the response.
	for _, x := range insp.Exchanges() {
		fmt.Println(x.ID, x.Method, x.URL, x.Status, x.RequestHeader.Get("Content-Type"))
	}
	// Output: 1 POST /orders?notify=email 201 application/json
}
