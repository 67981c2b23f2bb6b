package forward_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/router"
)

// The tests here serve a tunnel's listener: an agent's, on an edge on
// loopback.

// startEdge runs an edge whose router the test can query, and returns it
// with its agent address.
func startEdge(t *testing.T) (*edge.Server, *router.MemoryRouter, string) {
	t.Helper()
	rt := &router.MemoryRouter{}
	srv := &edge.Server{Domain: "example.test", Router: rt}
	ln := listenLoopback(t)
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeAgents(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return srv, rt, ln.Addr().String()
}

// dialEndpoint opens a raw connection to the agent behind name, as the edge
// does for a public client at client.
func dialEndpoint(t *testing.T, srv *edge.Server, rt *router.MemoryRouter, name string, client netip.AddrPort) net.Conn {
	t.Helper()
	routes, _ := rt.Lookup(context.Background(), "http", name)
	if len(routes) == 0 {
		t.Fatalf("no route for %s", name)
	}
	c, err := srv.DialRoute(context.Background(), routes[0], edge.ConnInfo{Client: client, Host: name})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestForwardHalfClose sends a payload, half-closes, and checks that every
// byte the upstream sends after the half-close still arrives.
func TestForwardHalfClose(t *testing.T) {
	srv, rt, addr := startEdge(t)
	// Upstream: reads to EOF, then answers with the payload's hash and a
	// trailer, then closes.
	upAddr := testnet.Serve(t, listenLoopback(t), func(c net.Conn) {
		h := sha256.New()
		io.Copy(h, c)
		c.Write(h.Sum(nil))
		c.Write(bytes.Repeat([]byte("after-half-close "), 20000))
	})
	c := &agent.Client{Addrs: []string{addr}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "echo")
	if err != nil {
		t.Fatal(err)
	}
	fwd := make(chan error, 1)
	go func() { fwd <- forward.Bytes{To: upAddr}.Serve(l) }()

	pc := dialEndpoint(t, srv, rt, "echo.example.test", netip.MustParseAddrPort("192.0.2.1:1234"))
	defer pc.Close()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go func() {
		pc.Write(payload)
		pc.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(pc)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	want := append(sum[:], bytes.Repeat([]byte("after-half-close "), 20000)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes back, want %d (hash ok: %v)", len(got), len(want), len(got) >= 32 && bytes.Equal(got[:32], sum[:]))
	}
	l.Close()
	if err := <-fwd; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestHTTPForwardThroughEdge serves an endpoint's listener: the app gets
// the edge's forwarding headers, and the log line names the public
// client.
func TestHTTPForwardThroughEdge(t *testing.T) {
	srv, _, agents := startEdge(t)
	public := listenLoopback(t)
	go srv.ServeHTTPListener(public)
	got := make(chan *http.Request, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		io.WriteString(w, "through")
	})
	c := &agent.Client{Addrs: []string{agents}}
	t.Cleanup(func() { c.Close() })
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	var log testtools.Buffer
	stop := serve(t, forward.HTTP{To: serveApp(t, app, false), Logger: debugLogger(&log)}, l)
	resp, err := client(t, public.Addr().String(), false).Get(l.URL() + "/through?x=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := <-got
	if string(body) != "through" || r.Header.Get("X-Forwarded-For") != "127.0.0.1" || len(r.Header["X-Forwarded-For"]) != 1 ||
		r.Header.Get("X-Forwarded-Proto") != "http" || r.Host != strings.TrimPrefix(l.URL(), "http://") {
		t.Errorf("body %q; the app got Host %q, header %v", body, r.Host, r.Header)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if want := "msg=http method=GET path=/through status=200 bytes=7 "; !strings.Contains(log.String(), want) || !strings.Contains(log.String(), " client=127.0.0.1:") {
		t.Errorf("log:\n%s\nwant a line with %s... client=127.0.0.1:...", log.String(), want)
	}
}
