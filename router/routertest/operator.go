package routertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/tunnelkit/tunnelkit/router"
)

// rule6 names the operator's reservations in failure messages.
const rule6 = "rule 6 (the operator's reservations)"

// reserver returns the router under test as a router.Reserver, or skips
// the test: the operator's reservations are an optional extension.
func (h *harness) reserver() router.Reserver {
	h.t.Helper()
	rs, ok := h.r.(router.Reserver)
	if !ok {
		h.t.Skip("the router is not a router.Reserver")
	}
	return rs
}

// reserve adds the reservation of name for identity, or fails the test.
func (h *harness) reserve(rule, name, identity string) {
	h.t.Helper()
	if err := h.addReservation(name, identity); err != nil {
		h.t.Fatalf("%s: AddReservation(%q for %s) = %v; want success", rule, name, identity, err)
	}
}

func (h *harness) addReservation(name, identity string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return h.reserver().AddReservation(ctx, router.Reservation{Name: name, Identity: identity})
}

func (h *harness) removeReservation(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return h.reserver().RemoveReservation(ctx, name)
}

// refuseReservation adds the reservation of name for identity, which must
// fail with an error wrapping router.ErrNameTaken while the state
// described by while holds.
func (h *harness) refuseReservation(while, name, identity string) {
	h.t.Helper()
	err := h.addReservation(name, identity)
	switch {
	case err == nil:
		h.t.Errorf("%s: while %s, AddReservation(%q for %s) succeeded; want an error wrapping router.ErrNameTaken", rule6, while, name, identity)
		h.removeReservation(name)
	case !errors.Is(err, router.ErrNameTaken):
		h.t.Errorf("%s: while %s, AddReservation(%q for %s) = %v; want an error wrapping router.ErrNameTaken", rule6, while, name, identity, err)
	}
}

// expectReservations checks that Reservations returns want, in order,
// and Reservation each of them.
func (h *harness) expectReservations(why string, want ...router.Reservation) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	rs := h.reserver()
	got, err := rs.Reservations(ctx)
	if err != nil {
		h.t.Fatalf("Reservations() = %v", err)
	}
	if !slices.Equal(got, want) {
		h.t.Errorf("%s: %s: Reservations() = %v; want %v, ordered by name", rule6, why, got, want)
	}
	for _, w := range want {
		if r, ok, err := rs.Reservation(ctx, w.Name); err != nil || !ok || r != w {
			h.t.Errorf("%s: %s: Reservation(%q) = %v, %v, %v; want %v", rule6, why, w.Name, r, ok, err, w)
		}
	}
}

// testOperatorReservations checks rule 6: a name the operator reserves
// for an identity is that identity's, with its tree, over every protocol
// of host names, whether or not it has routes, until it is removed.
func testOperatorReservations(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	rs := h.reserver()
	ctx := context.Background()
	h.expectReservations("an empty router")
	if _, ok, err := rs.Reservation(ctx, "none.example.test"); ok || err != nil {
		t.Errorf("%s: Reservation of a name never reserved = %v, %v; want none", rule6, ok, err)
	}

	const name = "shop.example.test"
	h.reserve("a free name", "Shop.Example.Test.", alice) // compared as normalised
	h.reserve("reserving a name again for its identity does nothing", name, alice)
	h.expectReservations("a name reserved", router.Reservation{Name: name, Identity: alice})
	for _, proto := range []string{"http", "https", "tls"} {
		h.expect(rule6+": a reserved name has no routes", proto, name)
	}
	while := "the operator reserved " + name + " for alice"
	for _, r := range []router.Route{
		route(bob, "http", name), pooled(bob, "http", name), route(bob, "https", name), route(bob, "tls", name),
		route(bob, "http", "*."+name), route(bob, "tls", "x."+name), route(bob, "http", "*.example.test"),
		route(bob, "http", "example.test"),
	} {
		h.refuse(rule6+" and "+rule2, while, r)
	}
	h.refuseReservation(while+" (another identity, the same name)", name, bob)
	h.refuseReservation(while+" (another identity, a name under it)", "x."+name, bob)
	h.refuseReservation(while+" (another identity, a name above it)", "example.test", bob)
	h.bind(rule2+": a sibling of a reserved name is free", route(bob, "http", "other.example.test"))
	h.reserve(rule6+" and "+rule2+": the reservation is alice's, who reserves in its tree", "x."+name, alice)
	h.expectCount("two names reserved for alice", 2, alice, 2, bob, 0)

	// Its identity binds it, and names under it, with or without Pool;
	// unbinding them leaves it reserved.
	a1, a2, a3 := route(alice, "http", name), pooled(alice, "tls", name), route(alice, "https", "*."+name)
	for _, r := range []router.Route{a1, a2, a3} {
		h.bind(rule6+": its identity binds a reserved name, and in its tree", r)
	}
	h.expect(rule6+": the reserved name bound by its identity", "http", name, a1)
	for _, r := range []router.Route{a1, a2, a3} {
		h.unbind(r, 0)
	}
	h.expect(rule6+": unbound again", "http", name)
	h.refuse(rule6+": unbinding its routes does not end the reservation", while+", and alice unbound her routes", route(bob, "http", name))

	// Removed, it is free at once; while its identity still has a route,
	// that route holds it.
	if err := h.removeReservation("x." + name); err != nil {
		t.Fatalf("RemoveReservation(x.%s) = %v", name, err)
	}
	h.bind("a route holds the name after the reservation goes", a1)
	if r, ok, err := rs.Reservation(ctx, "SHOP.example.TEST."); err != nil || !ok || r != (router.Reservation{Name: name, Identity: alice}) {
		t.Errorf("%s: Reservation of %s spelled in upper case with a trailing dot = %v, %v, %v; want it, spelled as stored", rule6, name, r, ok, err)
	}
	if err := h.removeReservation("SHOP.example.TEST."); err != nil {
		t.Fatalf("RemoveReservation(%s, in upper case with a trailing dot) = %v; want it removed (names are compared in lower case without a trailing dot)", name, err)
	}
	h.expectReservations("both removed")
	h.expect(rule6+": removing a reservation leaves its identity's routes", "http", name, a1)
	h.refuse(rule2, holds(a1), route(bob, "http", name))
	h.unbind(a1, 0)
	h.bind(rule6+": a reservation removed and its last route unbound, the name is free", route(bob, "http", name))
	if err := h.removeReservation(name); !errors.Is(err, router.ErrNoReservation) {
		t.Errorf("%s: RemoveReservation of a name not reserved = %v; want an error wrapping router.ErrNoReservation", rule6, err)
	}

	// Nobody reserves what another identity holds: by a route, a
	// reservation of rule 4, or in the tree of either.
	b := route(bob, "http", "bound.example.test")
	h.bind("a free name", b)
	h.refuseReservation(holds(b), b.Name, alice)
	h.refuseReservation(holds(b), "x."+b.Name, alice)
	h.refuseReservation(holds(b), "example.test", alice)
	h.unbind(b, longReserve)
	h.refuseReservation(b.Name+" is reserved for bob after his route went (rule 4)", b.Name, alice)
	h.reserve(rule6+": the identity a reservation of rule 4 keeps a name for may reserve it", b.Name, bob)

	// Invalid names.
	for _, bad := range []string{"", "*.wild.example.test", "no spaces.example.test", "a..b"} {
		if err := h.addReservation(bad, alice); !errors.Is(err, router.ErrInvalidName) {
			t.Errorf("AddReservation(%q) = %v; want an error wrapping router.ErrInvalidName", bad, err)
		}
	}
	h.expectReservations("at the end", router.Reservation{Name: b.Name, Identity: bob})
	h.expectCount("at the end", 1, alice, 0, bob, 1)
}

// expectCount checks, of a router that is a router.ReservationCounter,
// that it counts all reservations, and those of two identities, as
// Reservations lists them.
func (h *harness) expectCount(why string, all int, id1 string, of1 int, id2 string, of2 int) {
	h.t.Helper()
	rc, ok := h.r.(router.ReservationCounter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for _, c := range []struct {
		id string
		of int
	}{{id1, of1}, {id2, of2}} {
		gotAll, gotOf, err := rc.CountReservations(ctx, c.id)
		if err != nil || gotAll != all || gotOf != c.of {
			h.t.Errorf("%s: %s: CountReservations(%s) = %d, %d, %v; want %d in all, %d of %s", rule6, why, c.id, gotAll, gotOf, err, all, c.of, c.id)
		}
	}
}

// testReservationAtomicity checks rule 5 between Binds and AddReservation:
// of an AddReservation for one identity racing Binds of conflicting names
// by others, exactly one succeeds, every time.
func testReservationAtomicity(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	h.reserver()
	for i := range rounds / 4 {
		name := fmt.Sprintf("res%d.example.test", i)
		routes := []router.Route{route("id1", "http", name), route("id2", "tls", "x."+name), route("id3", "http", "*."+name)}
		errs := make([]error, len(routes)+1)
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; errs[0] = h.addReservation(name, "id0") })
		for j, r := range routes {
			wg.Go(func() { <-start; errs[j+1] = h.Bind(r) })
		}
		close(start)
		wg.Wait()
		won := 0
		for j, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, router.ErrNameTaken):
				t.Fatalf("%s with %s: round %d: racer %d: %v; want success or ErrNameTaken", rule5, rule6, i, j, err)
			}
		}
		if won != 1 {
			t.Fatalf("%s with %s: round %d: of a reservation of %s racing Binds of conflicting names by other identities, %d succeeded (%v); want exactly one",
				rule5, rule6, i, name, won, errs)
		}
	}
}
