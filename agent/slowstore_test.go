package agent_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/router"
)

// slowStoreRouter delays binds while delay is set, as a store (etcd) does
// that a dead edge's thousands of agents, all binding again at once, keep
// busy.
type slowStoreRouter struct {
	*router.MemoryRouter
	delay atomic.Int64 // nanoseconds
}

func (r *slowStoreRouter) wait(ctx context.Context) error {
	if d := time.Duration(r.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *slowStoreRouter) Bind(ctx context.Context, rt router.Route) error {
	if err := r.wait(ctx); err != nil {
		return err
	}
	return r.MemoryRouter.Bind(ctx, rt)
}

func (r *slowStoreRouter) Move(ctx context.Context, rt router.Route, from string) error {
	if err := r.wait(ctx); err != nil {
		return err
	}
	return r.MemoryRouter.Move(ctx, rt, from)
}

// sessionCount counts the sessions an edge opened.
type sessionCount struct{ opened atomic.Int32 }

func (o *sessionCount) Session(delta int) {
	if delta > 0 {
		o.opened.Add(1)
	}
}
func (*sessionCount) Endpoint(string, int)               {}
func (*sessionCount) Stream(int)                         {}
func (*sessionCount) Conn(string)                        {}
func (*sessionCount) Bytes(string, int64, int64)         {}
func (*sessionCount) Request(string, int, time.Duration) {}
func (*sessionCount) Refused(edge.Reason)                {}
func (*sessionCount) EndpointDown(string, bool)          {}

// TestRebindWaitsForASlowStore: when its edge dies, an agent reconnects
// to the next one, whose store takes 12 s to grant each bind (longer than
// the 10 s an agent gives an edge to open a session). The agent waits for
// the edge's answer on the session it opened, rather than give the bind
// up, close the session and do it all again, which, for thousands of
// agents at once, is what kept the store busy.
func TestRebindWaitsForASlowStore(t *testing.T) {
	t.Parallel()
	shared := &router.MemoryRouter{}
	fleet := func(context.Context, string) (string, error) { return "fleet", nil }
	start := func(srv *edge.Server) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); srv.ServeAgents(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
		return ln.Addr().String()
	}
	e1 := &edge.Server{Domain: "example.test", Router: shared, Authenticate: fleet, ID: "e1"}
	slow := &slowStoreRouter{MemoryRouter: shared}
	seen := &sessionCount{}
	e2 := &edge.Server{Domain: "example.test", Router: slow, Authenticate: fleet, ID: "e2", Observer: seen}
	a1, a2 := start(e1), start(e2)

	c := &agent.Client{Addrs: []string{a1, a2}, Token: "t", MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Listen(ctx, "http://device")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	slow.delay.Store(int64(12 * time.Second))
	e1.Close() // its agents come to e2, whose store is slow
	for {
		if eps := e2.Endpoints(); len(eps) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the endpoint did not come back on e2 within a minute (%d sessions opened there)", seen.opened.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := seen.opened.Load(); n != 1 {
		t.Errorf("e2 saw %d sessions of the agent: want 1, which waited for the store", n)
	}
}
