package edge_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/router"
)

// TestRefusedBindsThrottled: a tenant looping binds of another's name,
// from several goroutines of one session and from a second session, has
// its refusals come no faster than Limits.RefusedBinds at once and one a
// second after that, each counted; meanwhile the other tenant binds and
// serves as before, never made to wait (the guard holds a budget for the
// looping tenant alone).
func TestRefusedBindsThrottled(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	srv := &edge.Server{Observer: obs, Limits: edge.Limits{RefusedBinds: 5}}
	te, _ := tenantEdge(t, srv)
	alice := tenant(t, te, "alice")
	serve(t, bind(t, alice, "http://shop"), "alice")

	bobs := []*agent.Client{tenant(t, te, "bob"), tenant(t, te, "bob")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var refused, throttled, other atomic.Int64
	var loops sync.WaitGroup
	start := time.Now()
	for i := range 6 {
		c := bobs[i%len(bobs)]
		loops.Go(func() {
			for ctx.Err() == nil {
				_, err := c.Listen(ctx, "http://shop")
				switch {
				case errors.Is(err, agent.ErrNameTaken):
					refused.Add(1)
				case errors.Is(err, agent.ErrUnavailable):
					throttled.Add(1) // waited past its deadline: refused at once
				case ctx.Err() != nil:
				default:
					other.Add(1)
					t.Errorf("bob's bind of alice's name: %v", err)
					return
				}
			}
		})
	}
	// Meanwhile alice binds, serves and unbinds names of her own.
	for i := range 20 {
		l := bind(t, alice, "http://a"+string(rune('a'+i)))
		if resp, body := get(t, te, te.url("shop"), nil); resp.StatusCode != 200 || body != "alice /" {
			t.Fatalf("alice's shop during bob's loop: %d %q", resp.StatusCode, body)
		}
		l.Close()
	}
	// A few seconds of the loop: enough for a loop that nothing slows to
	// make thousands of binds.
	time.Sleep(3 * time.Second)
	cancel()
	loops.Wait()
	elapsed := time.Since(start)
	// At most the burst, one a second, and one wave of the loop's
	// goroutines let through together.
	if max := int64(5 + elapsed.Seconds() + 1 + 6); refused.Load() > max {
		t.Errorf("bob's loop had %d binds refused in %v: want at most %d", refused.Load(), elapsed.Round(time.Millisecond), max)
	}
	if refused.Load() < 5 {
		t.Errorf("bob's loop had %d binds refused: want the burst at least", refused.Load())
	}
	if got := obs.get("refused/" + string(edge.ReasonBindRefused)); got < refused.Load() {
		t.Errorf("refused/bind_refused = %d, want %d at least: %s", got, refused.Load(), obs)
	}
	if obs.get("refused/"+string(edge.ReasonBindThrottled)) == 0 {
		t.Errorf("no bind counted as throttled: %s", obs)
	}
	if n := edge.BindGuardOwners(srv); n != 1 {
		t.Errorf("the guard holds a budget for %d owners: want bob's alone", n)
	}
	t.Logf("bob: %d refused, %d refused as throttled, in %v; %s", refused.Load(), throttled.Load(), elapsed.Round(time.Millisecond), obs)
}

// storeDownRouter is an operator's Router whose store does not answer
// while down is set: its binds fail as a database's would.
type storeDownRouter struct {
	*router.MemoryRouter
	down   atomic.Bool
	failed atomic.Int64 // binds failed while down
}

func (r *storeDownRouter) Bind(ctx context.Context, rt router.Route) error {
	if r.down.Load() {
		r.failed.Add(1)
		return errors.New("the store did not answer")
	}
	return r.MemoryRouter.Bind(ctx, rt)
}

func (r *storeDownRouter) Move(ctx context.Context, rt router.Route, from string) error {
	if r.down.Load() {
		r.failed.Add(1)
		return errors.New("the store did not answer")
	}
	return r.MemoryRouter.Move(ctx, rt, from)
}

// TestStoreTroubleIsNoRefusal: binds that fail because the edge's Router
// did not answer (etcd, overloaded as an edge's agents all come back at
// once) are not the tenant's refusals: however many failed, the
// identity's next binds, once the store answers, wait for nothing
// (Limits.RefusedBinds). Counted, the failures of a fleet that shares one
// token would have every agent of it wait a second more than the last.
func TestStoreTroubleIsNoRefusal(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	rt := &storeDownRouter{MemoryRouter: &router.MemoryRouter{}}
	srv := &edge.Server{Domain: "example.test", Observer: obs, Router: rt, Authenticate: tokens, Limits: edge.Limits{RefusedBinds: 2}}
	te := edgeOn(t, srv, listen(t), listen(t))
	fleet := tenant(t, te, "alice") // one token, many devices
	rt.down.Store(true)
	// The agent tries again and again, as one of a fleet does while its
	// edge's store is slow.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err := fleet.Listen(ctx, "http://device0")
	cancel()
	if err == nil {
		t.Fatal("a bind went through while the store was down")
	}
	if n := rt.failed.Load(); n < 4 {
		t.Fatalf("%d binds failed while the store was down: want more than the 2 refusals allowed", n)
	}
	rt.down.Store(false)
	for i := range 8 {
		name := fmt.Sprintf("device%d", i)
		serve(t, bind(t, fleet, "http://"+name), name)
	}
	if resp, body := get(t, te, te.url("device7"), nil); resp.StatusCode != 200 || body != "device7 /" {
		t.Fatalf("device7: %d %q", resp.StatusCode, body)
	}
	for _, r := range []edge.Reason{edge.ReasonBindThrottled, edge.ReasonBindRefused} {
		if n := obs.get("refused/" + string(r)); n != 0 {
			t.Errorf("refused/%s = %d, want 0: the store's failures are no refusals (%s)", r, n, obs)
		}
	}
}
