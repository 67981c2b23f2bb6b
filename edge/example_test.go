package edge_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

// An edge mounted into an existing HTTP server, and an app behind it.
func ExampleServer() {
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	agents, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.ServeAgents(agents)

	// The app exposes itself on the edge.
	l, err := agent.Listen(context.Background(), agents.Addr().String(), "http://hello")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s", strings.Split(r.Header.Get("X-Forwarded-For"), ",")[0])
	}))

	// The edge is an http.Handler: here it serves one request in-process.
	req := httptest.NewRequest("GET", "http://hello.example.test/", nil)
	req.RemoteAddr = "203.0.113.7:51000"
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	fmt.Println(rec.Code, string(body))
	// Output:
	// 200 hello, 203.0.113.7
}
