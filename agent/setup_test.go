package agent_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// listenResult is what a Listen in the background returned.
type listenResult struct {
	l   *agent.Listener
	err error
}

// listenAsync runs c.Listen(ctx, url) in the background.
func listenAsync(ctx context.Context, c *agent.Client, url string) <-chan listenResult {
	ch := make(chan listenResult, 1)
	go func() {
		l, err := c.Listen(ctx, url)
		ch <- listenResult{l, err}
	}()
	return ch
}

// nextEvent returns the next event of kind, failing the test when another
// kind comes first, or none within 20 s.
func (ev events) next(t *testing.T, kind agent.EventKind) agent.Event {
	t.Helper()
	select {
	case e := <-ev:
		if e.Kind != kind {
			t.Fatalf("event %v (%v), want %v", e.Kind, e.Err, kind)
		}
		return e
	case <-time.After(20 * time.Second):
		t.Fatalf("no %v event within 20 s", kind)
		return agent.Event{}
	}
}

// TestListenWaitsForItsEdge starts the agent, then its edge 3 s later on
// the same port: Listen tries again with backoff, its attempts refused,
// and returns the URL once the edge is up.
func TestListenWaitsForItsEdge(t *testing.T) {
	t.Parallel()
	ln := testnet.Listen(t)
	addr := ln.Addr().String()
	ln.Close()
	ev := make(events, 1000)
	c := &agent.Client{Addrs: []string{addr}, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, OnEvent: ev.record}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	done := listenAsync(ctx, c, "http://app")

	// The agent tries before the edge is there: refused.
	if e := ev.next(t, agent.Reconnecting); !errors.Is(e.Err, syscall.ECONNREFUSED) || e.Addr != addr || e.Attempt != 2 {
		t.Fatalf("first Reconnecting event: %+v, want attempt 2 at %s after ECONNREFUSED", e, addr)
	}

	// The scenario: the edge starts 3 s after the agent, on its port.
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	agents, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the edge's port was taken meanwhile: %v", err)
	}
	srv := &edge.Server{Domain: "example.test", Router: &router.MemoryRouter{}}
	public := testnet.Listen(t)
	_, port, _ := net.SplitHostPort(public.Addr().String())
	srv.HTTPPort = port
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(public) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })

	r := <-done
	if r.err != nil {
		t.Fatalf("Listen: %v", r.err)
	}
	if want := "http://app.example.test:" + port; r.l.URL() != want {
		t.Fatalf("URL %q, want %q", r.l.URL(), want)
	}
	serveEdgeApp(t, c, r.l)
	if body, err := getURL(t, r.l.URL()+"/x"); err != nil || body != "app /x" {
		t.Fatalf("GET through the edge: %q, %v", body, err)
	}
	// Every failed attempt was refused, and told; then the session opened.
	for {
		e := <-ev
		if e.Kind == agent.Connected {
			break
		}
		if e.Kind != agent.Reconnecting || !errors.Is(e.Err, syscall.ECONNREFUSED) {
			t.Fatalf("event %v (%v), want Reconnecting after ECONNREFUSED until Connected", e.Kind, e.Err)
		}
	}
}

// TestListenWaitsForAGrant: an endpoint the edge cannot grant for now
// (here, the session holds as many as the edge allows) is asked for again
// until it is granted (here, once another listener closed).
func TestListenWaitsForAGrant(t *testing.T) {
	e := startHTTPEdge(t, &edge.Server{Limits: edge.Limits{EndpointsPerSession: 1}})
	ev := make(events, 1000)
	c := &agent.Client{Addrs: []string{e.agents}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, OnEvent: ev.record}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := c.Listen(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	ev.next(t, agent.Connected)
	done := listenAsync(ctx, c, "two")
	if e := ev.next(t, agent.Reconnecting); !errors.Is(e.Err, agent.ErrUnavailable) {
		t.Fatalf("Reconnecting event: %+v, want one after ErrUnavailable", e)
	}
	first.Close()
	r := <-done
	if r.err != nil {
		t.Fatalf("Listen: %v", r.err)
	}
	if want := "http://two.example.test:" + e.http; r.l.URL() != want {
		t.Fatalf("URL %q, want %q", r.l.URL(), want)
	}
}

// TestCloseEndsTheWait: Close ends a Listen that waits for its edge.
func TestCloseEndsTheWait(t *testing.T) {
	ev := make(events, 1000)
	c := &agent.Client{Addrs: []string{closedAddr(t)}, OnEvent: ev.record}
	done := listenAsync(context.Background(), c, "app")
	ev.next(t, agent.Reconnecting)
	c.Close()
	if r := <-done; !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("Listen after Close: %v, want net.ErrClosed", r.err)
	}
}

// slowRouter is a MemoryRouter whose Bind of one name waits until the
// test lets it go.
type slowRouter struct {
	*router.MemoryRouter
	name    string
	waiting chan struct{} // a token when a Bind of name waits
	release chan struct{} // closed to let it go
}

func (r *slowRouter) Bind(ctx context.Context, rt router.Route) error {
	if rt.Name == r.name {
		r.waiting <- struct{}{}
		<-r.release
	}
	return r.MemoryRouter.Bind(ctx, rt)
}

// TestListenGivingUpKeepsTheSession: a Listen whose context ends while
// the edge has not answered its bind returns the context's cause, and
// the session stays, with the endpoint bound before it: no reconnection,
// and its connections still arrive. When the edge grants the abandoned
// endpoint after all, the agent unbinds it: the edge holds no endpoint
// the agent knows nothing of.
func TestListenGivingUpKeepsTheSession(t *testing.T) {
	t.Parallel()
	rt := &slowRouter{MemoryRouter: &router.MemoryRouter{}, name: "slow.example.test", waiting: make(chan struct{}, 1), release: make(chan struct{})}
	srv := &edge.Server{Domain: "example.test", Router: rt}
	ln := testnet.Listen(t)
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeAgents(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })

	ev := make(events, 100)
	c := &agent.Client{Addrs: []string{ln.Addr().String()}, OnEvent: ev.record}
	defer c.Close()
	kept, err := c.Listen(context.Background(), "http://kept")
	if err != nil {
		t.Fatal(err)
	}
	ev.next(t, agent.Connected)

	ctx, cancel := context.WithCancelCause(context.Background())
	gaveUp := errors.New("the caller gave up")
	res := listenAsync(ctx, c, "http://slow")
	<-rt.waiting // the edge is binding it
	cancel(gaveUp)
	if r := <-res; !errors.Is(r.err, gaveUp) {
		t.Fatalf("Listen whose context ended: %v, %v; want its cause", r.l, r.err)
	}
	close(rt.release) // the edge grants it now

	// The endpoint granted late is unbound by the agent.
	testwait.Within(t, 10*time.Second, "the late endpoint unbound", func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "slow.example.test")
		return len(routes) == 0
	})
	// The session stayed, and its endpoint works.
	select {
	case e := <-ev:
		t.Fatalf("the session changed: %v (%v)", e.Kind, e.Err)
	default:
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := kept.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	routes, _ := rt.Lookup(context.Background(), "http", "kept.example.test")
	if len(routes) != 1 {
		t.Fatalf("%d routes for the endpoint bound before, want 1", len(routes))
	}
	conn, err := srv.DialRoute(context.Background(), routes[0], edge.ConnInfo{Host: "kept.example.test"})
	if err != nil {
		t.Fatalf("dialling the endpoint bound before: %v", err)
	}
	conn.Close()
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatalf("the endpoint bound before: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the endpoint bound before got no connection")
	}
	select {
	case e := <-ev:
		t.Fatalf("the session changed: %v (%v)", e.Kind, e.Err)
	default:
	}
}
