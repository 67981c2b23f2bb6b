package routertest

import (
	"errors"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// Reservations that the tests never wait out last long; those they wait
// out are short, and the wait for one polls for the outcome.
const (
	longReserve  = time.Minute
	shortReserve = 200 * time.Millisecond
	pollEvery    = 20 * time.Millisecond
	lapseGrace   = 10 * time.Second // how long after its end a lapsed reservation may still refuse
)

// testReservations checks rule 4: the last route of a name unbound with a
// reservation leaves the name, and its tree, to its identity for a while.
func testReservations(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)

	// While reserved: no routes, and nobody else binds in the tree, over any
	// protocol, pooled or not.
	const name = "res.r.example.test"
	a := route(alice, "http", name)
	h.bind("a free name", a)
	h.unbind(a, longReserve)
	while := "alice's http route of " + name + " went with a reservation"
	for _, proto := range []string{"http", "https", "tls"} {
		h.expect(rule4+": a reserved name has no routes", proto, name)
	}
	h.refuse(rule4+": another identity, the same name", while, route(bob, "http", name))
	h.refuse(rule4+": another identity, the same name (Pool does not share with another identity)", while, pooled(bob, "http", name))
	h.refuse(rule4+" and "+rule1+": another identity, the same name over tls", while, route(bob, "tls", name))
	h.refuse(rule4+" and "+rule1+": another identity, the same name over https", while, route(bob, "https", name))
	h.refuse(rule4+" and "+rule2+": another identity, a wildcard over it", while, route(bob, "http", "*.r.example.test"))
	h.refuse(rule4+" and "+rule2+": another identity, the wildcard of it", while, route(bob, "tls", "*."+name))
	h.refuse(rule4+" and "+rule2+": another identity, a name under it", while, route(bob, "http", "x."+name))
	h.refuse(rule4+" and "+rule2+": another identity, a name above it", while, route(bob, "http", "r.example.test"))
	for _, proto := range []string{"http", "https", "tls"} {
		h.expect(rule4+": a refused Bind leaves no route", proto, name)
	}
	h.bind(rule2+": a sibling of a reserved name is free", route(bob, "http", "other.r.example.test"))
	h.bind(rule4+" and "+rule2+": the reservation counts as held by its identity, who binds freely in its tree", route(alice, "tls", name))
	h.bind(rule4+" and "+rule2+": the reservation counts as held by its identity, who binds freely in its tree", route(alice, "http", "x."+name))

	// The identity binds the name again without Pool, which ends the
	// reservation: the new route is the only one, and when it goes with
	// no reservation the name is free at once.
	const again = "again.example.test"
	g := route(alice, "http", again)
	h.bind("a free name", g)
	h.unbind(g, longReserve)
	g2 := route(alice, "http", again)
	h.bind(rule4+": its identity binds a reserved name again without Pool", g2)
	h.expect(rule4+": the name bound again", "http", again, g2)
	h.refuse(rule3+": the route bound again did not ask to share", holds(g2), route(alice, "http", again))
	h.unbind(g2, 0)
	h.bind(rule4+": binding the name again ended the reservation", route(bob, "http", again))

	// The identity binds it again with Pool, whatever the route that went
	// had asked; routes asking to pool join it.
	for _, was := range []router.Route{route(alice, "http", "pool1.example.test"), pooled(alice, "http", "pool2.example.test")} {
		h.bind("a free name", was)
		h.unbind(was, longReserve)
		p1, p2 := pooled(alice, "http", was.Name), pooled(alice, "http", was.Name)
		h.bind(rule4+": its identity binds a reserved name again with Pool", p1)
		h.bind(rule3+": the same identity, both asking to pool", p2)
		h.expect(rule4+": the name bound again", "http", was.Name, p1, p2)
		h.unbind(p1, 0)
		h.unbind(p2, 0)
		h.bind(rule4+": binding the name again ended the reservation", route(bob, "http", was.Name))
	}

	// A lapsed reservation is gone: another identity binds the name, the
	// wildcard over it and names under it, over any protocol.
	l1 := route(alice, "http", "lapse.example.test")
	l2 := route(alice, "http", "*.lapse2.example.test")
	h.bind("a free name", l1)
	h.bind("a free name", l2)
	h.unbind(l1, shortReserve)
	h.unbind(l2, shortReserve)
	lapse := time.Now().Add(shortReserve)
	want := []router.Route{
		route(bob, "http", "lapse.example.test"),
		route(bob, "tls", "x.lapse2.example.test"),
	}
	awaitBinds(h, lapse, want)
	h.expect(rule4+": the name bound after the reservation lapsed", "http", "lapse.example.test", want[0])
	h.refuse(rule4+": a lapsed reservation is gone; the name is bob's now", holds(want[0]), route(alice, "http", "lapse.example.test"))
	h.bind(rule4+": a lapsed reservation is gone", route(bob, "http", "*.lapse2.example.test"))
}

// awaitBinds binds each of routes, which another identity's reservation
// ending at lapse holds off, polling until the router accepts it. It fails
// the test when one is still refused lapseGrace after lapse.
func awaitBinds(h *harness, lapse time.Time, routes []router.Route) {
	h.t.Helper()
	deadline := lapse.Add(lapseGrace)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	pending := routes
	for {
		var still []router.Route
		for _, r := range pending {
			err := h.Bind(r)
			switch {
			case err == nil:
			case errors.Is(err, router.ErrNameTaken):
				still = append(still, r)
			default:
				h.t.Fatalf("%s: Bind(%s) = %v; want success, or ErrNameTaken until the reservation lapses", rule4, desc(r), err)
			}
		}
		pending = still
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: a lapsed reservation is gone: Bind of %s still fails with ErrNameTaken %v after a reservation of %v lapsed",
				rule4, descAll(pending), lapseGrace, shortReserve)
		}
		<-tick.C
	}
}
