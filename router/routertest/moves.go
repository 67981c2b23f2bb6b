package routertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tunnelkit/tunnelkit/router"
)

// ruleMove names the contract of router.Mover in failure messages.
const ruleMove = "Move (r in the place of the routes of session from)"

// move calls the router's Move with a timeout.
func (h *harness) move(m router.Mover, r router.Route, from string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return m.Move(ctx, r, from)
}

// moved is r bound by another session of the same identity, to move to.
func moved(r router.Route) router.Route {
	n := serial.Add(1)
	r.SessionID = fmt.Sprintf("session-%s-%d", r.Identity, n)
	r.TunnelID = fmt.Sprintf("tunnel-%d", n)
	return r
}

// testMoves checks router.Mover, for a Router that implements it: Move
// binds a route in the place of another session's routes of the same
// name, in one step, under the ownership rules for the rest.
func testMoves(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	m, ok := h.r.(router.Mover)
	if !ok {
		t.Skip("the Router does not implement router.Mover")
	}
	mustMove := func(rule string, r router.Route, from string) {
		t.Helper()
		if err := h.move(m, r, from); err != nil {
			t.Fatalf("%s: Move(%s, %q) = %v; want success", rule, desc(r), from, err)
		}
	}
	refuseMove := func(rule string, r router.Route, from string) {
		t.Helper()
		if err := h.move(m, r, from); !errors.Is(err, router.ErrNameTaken) {
			t.Errorf("%s: Move(%s, %q) = %v; want an error wrapping router.ErrNameTaken", rule, desc(r), from, err)
		}
	}

	// A route that did not ask to share is replaced by the same
	// identity's route of another session; the old route's Unbind,
	// later, with a reservation, leaves the new one alone.
	const solo = "move-solo.example.test"
	a := route(alice, "http", solo)
	h.bind("a free name", a)
	b := moved(a)
	mustMove(ruleMove+": the same identity, from the session of the name's route", b, a.SessionID)
	h.expect(ruleMove+": the moved route alone", "http", solo, b)
	mustMove(ruleMove+": moving a route bound already does nothing", b, a.SessionID)
	h.expect(ruleMove+": the moved route alone", "http", solo, b)
	h.unbind(a, longReserve)
	h.expect(ruleMove+": unbinding the route moved from leaves the new one", "http", solo, b)
	h.refuse(rule2+": the moved route holds its name", holds(b), route(bob, "http", solo))
	h.unbind(b, 0)
	h.bind(ruleMove+": the route moved from left no reservation once gone", route(bob, "http", solo))

	// Without routes of the session from, Move is Bind.
	c := route(carol, "tls", "move-fresh.example.test")
	mustMove(ruleMove+": a free name, no route of the session", c, "session-gone")
	h.expect(ruleMove+": Move of a free name binds it", "tls", "move-fresh.example.test", c)
	refuseMove(ruleMove+" and "+rule1+": another identity's name", route(alice, "http", "move-fresh.example.test"), c.SessionID)
	refuseMove(ruleMove+" and "+rule2+": under another identity's name", route(alice, "http", "x.move-fresh.example.test"), c.SessionID)
	h.expect(ruleMove+": a refused Move leaves the name as it was", "tls", "move-fresh.example.test", c)
	refuseMove(ruleMove+" and "+rule3+": another route of the name, not shared", route(carol, "tls", "move-fresh.example.test"), "session-gone")
	h.expect(ruleMove+": a refused Move leaves the name as it was", "tls", "move-fresh.example.test", c)

	// A reserved name is its identity's to move into.
	const reserved = "move-kept.example.test"
	k := route(alice, "http", reserved)
	h.bind("a free name", k)
	h.unbind(k, longReserve)
	mustMove(ruleMove+" and "+rule4+": its identity moves into its reserved name", moved(k), k.SessionID)

	// In a pool, only the session's own routes make room; the others
	// share with the moved route as rule 3 says.
	const pool = "move-pool.example.test"
	p1, p2 := pooled(alice, "http", pool), pooled(alice, "http", pool)
	h.bind("a free name", p1)
	h.bind(rule3+": both asking to pool", p2)
	refuseMove(ruleMove+" and "+rule3+": the pool's other route shares only with a route that asks to", moved(route(alice, "http", pool)), p1.SessionID)
	h.expect(ruleMove+": a refused Move leaves the pool as it was", "http", pool, p1, p2)
	p3 := moved(p1)
	mustMove(ruleMove+": a pool's route moves", p3, p1.SessionID)
	h.expect(ruleMove+": the pool with the moved route", "http", pool, p2, p3)

	// The routes moved from need not have asked to share, nor have the
	// same policy: they make room.
	const policied = "move-policy.example.test"
	o := withPolicy(route(alice, "https", policied), `{"basic_auth":{"credentials":["a:b"]}}`)
	h.bind("a free name", o)
	n := moved(pooled(alice, "https", policied))
	mustMove(ruleMove+": the routes moved from do not count under rule 3", n, o.SessionID)
	h.expect(ruleMove+": the moved route, with its own Pool and Policy", "https", policied, n)

	// A session's route replaced by one of the same session (an endpoint
	// changed in place: another tunnel, pool setting and policy), with no
	// moment at which the name is free.
	const inPlace = "move-in-place.example.test"
	old := route(alice, "http", inPlace)
	h.bind("a free name", old)
	repl := withPolicy(old, `{"cidr_deny":["192.0.2.0/24"]}`)
	repl.TunnelID, repl.Pool = fmt.Sprintf("tunnel-%d", serial.Add(1)), true
	mustMove(ruleMove+": a route in the place of its own session's", repl, old.SessionID)
	h.expect(ruleMove+": the replacing route alone", "http", inPlace, repl)
	h.refuse(rule2+": the replacing route holds the name", holds(repl), route(bob, "http", inPlace))

	// TCP ports move too.
	port := route(alice, "tcp", "20091")
	h.bind("a free port", port)
	mustMove(ruleMove+": a tcp port", moved(port), port.SessionID)
	refuseMove(ruleMove+" and "+ruleTCP+": another identity's port", route(bob, "tcp", "20091"), port.SessionID)
}

// testMovesNeverUnrouted moves a route back and forth between two sessions
// while lookups run: none may find the name without a route.
func testMovesNeverUnrouted(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	m, ok := h.r.(router.Mover)
	if !ok {
		t.Skip("the Router does not implement router.Mover")
	}
	const name = "move-busy.example.test"
	cur := route(alice, "http", name)
	h.bind("a free name", cur)
	var (
		stop    atomic.Bool
		empty   atomic.Int64
		lookups atomic.Int64
		wg      sync.WaitGroup
	)
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				routes, err := h.Lookup("http", name)
				if err == nil && len(routes) == 0 {
					empty.Add(1)
				}
				lookups.Add(1)
			}
		})
	}
	// At least 100 moves, and more while lookups are few between them
	// (a fast router moves faster than lookups come).
	moves := 0
	for ; moves < 100 || moves < 20000 && lookups.Load() < 50*int64(moves); moves++ {
		next := moved(cur)
		if err := h.move(m, next, cur.SessionID); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("%s: Move(%s, %q) = %v", ruleMove, desc(next), cur.SessionID, err)
		}
		cur = next
	}
	stop.Store(true)
	wg.Wait()
	h.expect(ruleMove+": the last route moved to, alone", "http", name, cur)
	if n := empty.Load(); n > 0 {
		t.Errorf("%s: %d of %d lookups during %d moves found no route; want none: Move adds the route before it removes those it replaces", ruleMove, n, lookups.Load(), moves)
	}
}
