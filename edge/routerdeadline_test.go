package edge_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/router"
)

// deadlineRouter is a MemoryRouter that counts the calls made to it with
// a context that has no deadline: a Router of an operator's (a database, a
// control plane) would hold such a call for as long as it likes.
type deadlineRouter struct {
	*router.MemoryRouter
	calls, unbounded atomic.Int32
	mu               sync.Mutex
	which            []string // the calls without a deadline
}

func (r *deadlineRouter) note(ctx context.Context, op string) {
	r.calls.Add(1)
	if _, ok := ctx.Deadline(); !ok {
		r.unbounded.Add(1)
		r.mu.Lock()
		r.which = append(r.which, op)
		r.mu.Unlock()
	}
}

func (r *deadlineRouter) Lookup(ctx context.Context, proto, host string) ([]router.Route, error) {
	r.note(ctx, "Lookup "+proto+" "+host)
	return r.MemoryRouter.Lookup(ctx, proto, host)
}

func (r *deadlineRouter) LookupPath(ctx context.Context, proto, host, path string) ([]router.Route, error) {
	r.note(ctx, "LookupPath "+proto+" "+host+path)
	return r.MemoryRouter.LookupPath(ctx, proto, host, path)
}

func (r *deadlineRouter) Bind(ctx context.Context, rt router.Route) error {
	r.note(ctx, "Bind "+rt.Name)
	return r.MemoryRouter.Bind(ctx, rt)
}

func (r *deadlineRouter) Unbind(ctx context.Context, rt router.Route, reserve time.Duration) error {
	r.note(ctx, "Unbind "+rt.Name)
	return r.MemoryRouter.Unbind(ctx, rt, reserve)
}

// TestRouterCallsHaveDeadlines: every call the edge makes to its Router
// has a deadline, for HTTP requests, TLS connections passed through or
// for no name, and TCP connections (issue #33: proxyL4 and chooseTLS
// looked up with context.Background()), and for binds and unbinds.
func TestRouterCallsHaveDeadlines(t *testing.T) {
	t.Parallel()
	rt := &deadlineRouter{MemoryRouter: &router.MemoryRouter{}}
	pki := testpki.New(t)
	agents, httpLn, tlsLn := listen(t), listen(t), listen(t)
	_, httpPort, _ := net.SplitHostPort(httpLn.Addr().String())
	_, tlsPort, _ := net.SplitHostPort(tlsLn.Addr().String())
	srv := &edge.Server{Domain: "example.test", HTTPPort: httpPort, TLSPort: tlsPort, TCPPorts: edge.PortRange{Min: 1024, Max: 65535}, Router: rt}
	e := edgeOn(t, srv, agents, httpLn)
	go srv.ServeSNI(tlsLn)
	l4 := &l4Edge{srv: srv, agentAddr: agents.Addr().String(), tlsAddr: tlsLn.Addr().String()}

	e.serveApp(t, "app", nameHandler("app"))
	l4.serveTLSApp(t, "tls://secure.example.test", "secure", pki.Issue(t, "secure.example.test"))
	echo := startEchoUpstream(t)
	tcpL, tcpAgent := l4.forwardTCP(t, agent.Endpoint{URL: "tcp://"}, echo, 0)

	if resp, body := get(t, e, e.url("app")+"/", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP: %d %q", resp.StatusCode, body)
	}
	if got, err := tlsRoundTrip(l4.tlsAddr, "secure.example.test", pki.Pool); err != nil || got != "secure: ping" {
		t.Fatalf("TLS: %q, %v", got, err)
	}
	tlsRoundTrip(l4.tlsAddr, "nobody.example.test", pki.Pool)
	c, err := net.Dial("tcp", tcpAddrOf(t, tcpL.URL()))
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("x"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("TCP: %v", err)
	}
	c.Close()
	tcpAgent.Close() // its unbind

	if rt.calls.Load() < 8 {
		t.Fatalf("%d calls to the Router; the test drove fewer than it means to", rt.calls.Load())
	}
	if n := rt.unbounded.Load(); n > 0 {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		t.Fatalf("%d of %d calls to the Router had no deadline: %q", n, rt.calls.Load(), rt.which)
	}
}
