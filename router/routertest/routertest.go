// Package routertest checks implementations of router.Router against its
// contract, as golang.org/x/net/nettest checks a net.Conn: the in-memory
// router.MemoryRouter and a router over a shared store run the same tests.
//
// Typical use, in the tests of an implementation:
//
//	func TestRouterContract(t *testing.T) {
//		routertest.Run(t, func(t *testing.T) router.Router {
//			r, err := mystore.NewRouter(mystore.Config{Prefix: t.Name()}) // empty
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { r.Close() })
//			return r
//		})
//	}
//
// The tests check the contract written on router.Router (its ownership rules
// 1 to 6, and what Lookup returns) and nothing an implementation is free to
// choose: which names are valid, Route.Edge (always empty in the routes the
// tests bind), the order of a pool's routes beyond round robin, the text of
// errors beyond wrapping router.ErrNameTaken. They bind valid host names under
// example.test, and tcp ports from 20001. A failure names the rule that was
// broken; each subtest (EmptyRouter, Lookup, Ownership, Trees, TCPPorts,
// Pools, Unbind, Reservations, Atomicity, ConcurrentLookups,
// OperatorReservations, ReservationAtomicity, Moves, MovesNeverUnrouted,
// Revocations, Paths, PathMoves) can be run on its own with go test -run.
// OperatorReservations and ReservationAtomicity, of rule 6, run only
// against a router.Reserver, Moves and MovesNeverUnrouted only against a
// router.Mover, Revocations only against a router.Revoker, Paths only
// against a router.PathRouter, and PathMoves against a Router that is
// both a Mover and a PathRouter: they are skipped for another Router.
//
// The reservations the tests wait out last 200ms; the wait polls Bind until
// it succeeds, for up to 10s after the lapse, so the suite asserts on
// outcomes, never on timing. Other reservations last a minute and are never
// waited out. The suite runs in about a second against router.MemoryRouter.
package routertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// Run runs the contract's tests as subtests of t. newRouter returns a new,
// empty router for each subtest, or for each case of a subtest with cases,
// and registers its own cleanup with t.Cleanup.
func Run(t *testing.T, newRouter func(t *testing.T) router.Router) {
	tests := []struct {
		name string
		fn   func(*testing.T, makeRouter)
	}{
		{"EmptyRouter", testEmptyRouter},
		{"Lookup", testLookup},
		{"Ownership", testOwnership},
		{"Trees", testTrees},
		{"TCPPorts", testTCPPorts},
		{"Pools", testPools},
		{"Unbind", testUnbind},
		{"Reservations", testReservations},
		{"Atomicity", testAtomicity},
		{"ConcurrentLookups", testConcurrentLookups},
		{"OperatorReservations", testOperatorReservations},
		{"ReservationAtomicity", testReservationAtomicity},
		{"Moves", testMoves},
		{"MovesNeverUnrouted", testMovesNeverUnrouted},
		{"Revocations", testRevocations},
		{"Paths", testPaths},
		{"PathMoves", testPathMoves},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newRouter) })
	}
}

type makeRouter = func(t *testing.T) router.Router

// The rules of the contract, as failure messages name them.
const (
	rule1      = "rule 1 (one namespace for host names)"
	rule2      = "rule 2 (a name owns its tree)"
	rule3      = "rule 3 (pools by consent)"
	rule4      = "rule 4 (reservations)"
	rule5      = "rule 5 (atomicity)"
	ruleTCP    = "rules 1 and 2 (a tcp port is a namespace of its own)"
	ruleLookup = "Lookup (the most specific pattern of proto matching host)"
	ruleRR     = "Lookup (round robin over a pool)"
	ruleUnbind = "Unbind (removes the route with r's Proto, Name, SessionID and TunnelID)"
)

// callTimeout bounds each call of a Router method.
const callTimeout = 10 * time.Second

// The identities the tests bind names for.
const (
	alice = "alice"
	bob   = "bob"
	carol = "carol"
)

// serial numbers routes, so that every route of a test run has its own
// TunnelID and SessionID even if routers share a store.
var serial atomic.Uint64

// route returns a route of identity for proto and name, with a TunnelID and
// SessionID of its own.
func route(identity, proto, name string) router.Route {
	n := serial.Add(1)
	return router.Route{
		Proto:     proto,
		Name:      name,
		Identity:  identity,
		TunnelID:  fmt.Sprintf("tunnel-%d", n),
		SessionID: fmt.Sprintf("session-%s-%d", identity, n),
	}
}

// pooled is route with Pool set.
func pooled(identity, proto, name string) router.Route {
	r := route(identity, proto, name)
	r.Pool = true
	return r
}

// withPolicy is r with the traffic policy spec, as an edge stores it.
func withPolicy(r router.Route, spec string) router.Route {
	r.Policy = spec
	return r
}

// harness is a router under test and the test using it.
type harness struct {
	t *testing.T
	r router.Router
}

func newHarness(t *testing.T, newRouter makeRouter) *harness {
	t.Helper()
	r := newRouter(t)
	if r == nil {
		t.Fatal("routertest: newRouter returned nil")
	}
	return &harness{t: t, r: r}
}

// Bind calls the router's Bind with a timeout. Bind, Unbind and Lookup are
// safe to call from any goroutine.
func (h *harness) Bind(r router.Route) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return h.r.Bind(ctx, r)
}

// Unbind calls the router's Unbind with a timeout.
func (h *harness) Unbind(r router.Route, reserve time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return h.r.Unbind(ctx, r, reserve)
}

// Lookup calls the router's Lookup with a timeout.
func (h *harness) Lookup(proto, host string) ([]router.Route, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return h.r.Lookup(ctx, proto, host)
}

// bind binds r; the test cannot go on if the router refuses it. rule says
// why r must be accepted.
func (h *harness) bind(rule string, r router.Route) {
	h.t.Helper()
	if err := h.Bind(r); err != nil {
		h.t.Fatalf("%s: Bind(%s) = %v; want success", rule, desc(r), err)
	}
}

// refuse binds r, which must fail with an error wrapping router.ErrNameTaken
// under rule while the state described by while holds. It returns the error.
// When the router accepts r, refuse reports it and unbinds r again, so that
// the checks after it test what they mean to.
func (h *harness) refuse(rule, while string, r router.Route) error {
	h.t.Helper()
	err := h.Bind(r)
	switch {
	case err == nil:
		h.t.Errorf("%s: while %s, Bind(%s) succeeded; want an error wrapping router.ErrNameTaken", rule, while, desc(r))
		h.unbind(r, 0)
	case !errors.Is(err, router.ErrNameTaken):
		h.t.Errorf("%s: while %s, Bind(%s) = %v; want an error wrapping router.ErrNameTaken", rule, while, desc(r), err)
	case err.Error() == "":
		h.t.Errorf("%s: while %s, Bind(%s) failed with an empty message", rule, while, desc(r))
	}
	return err
}

// unbind unbinds r; the test cannot go on if that fails.
func (h *harness) unbind(r router.Route, reserve time.Duration) {
	h.t.Helper()
	if err := h.Unbind(r, reserve); err != nil {
		h.t.Fatalf("Unbind(%s, %v) = %v; want nil", desc(r), reserve, err)
	}
}

// lookup looks host up; the test cannot go on if that fails.
func (h *harness) lookup(proto, host string) []router.Route {
	h.t.Helper()
	routes, err := h.Lookup(proto, host)
	if err != nil {
		h.t.Fatalf("Lookup(%q, %q) = %v; want a nil error", proto, host, err)
	}
	return routes
}

// expect checks that Lookup(proto, host) returns exactly want, in any order,
// under rule.
func (h *harness) expect(rule, proto, host string, want ...router.Route) []router.Route {
	h.t.Helper()
	got := h.lookup(proto, host)
	if !sameRoutes(got, want) {
		h.t.Errorf("%s: Lookup(%q, %q) = %s; want %s", rule, proto, host, descAll(got), descAll(want))
	}
	return got
}

// normalise is a name as the contract compares it: in lower case, without
// one trailing dot.
func normalise(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// sameRoute reports whether got is want as Lookup must return it: every
// field as bound (the Policy too: other edges enforce it), the Name
// normalised. Edge is the implementation's.
func sameRoute(got, want router.Route) bool {
	return got.Proto == want.Proto &&
		got.Name == normalise(want.Name) &&
		got.TunnelID == want.TunnelID &&
		got.SessionID == want.SessionID &&
		got.Identity == want.Identity &&
		got.Pool == want.Pool &&
		got.Policy == want.Policy &&
		got.Path == wantPath(want) &&
		got.StripPrefix == want.StripPrefix
}

// wantPath is the Path of a route as Lookup must return it: normalised.
func wantPath(r router.Route) string {
	p, ok := router.NormalisePath(r.Path)
	if !ok {
		return r.Path
	}
	return p
}

// sameRoutes reports whether got and want hold the same routes, in any order.
func sameRoutes(got, want []router.Route) bool {
	if len(got) != len(want) {
		return false
	}
	used := make([]bool, len(got))
next:
	for _, w := range want {
		for i, g := range got {
			if !used[i] && sameRoute(g, w) {
				used[i] = true
				continue next
			}
		}
		return false
	}
	return true
}

// covers reports whether pattern, normalised, matches host under the
// contract: itself, or for "*.base" a name of one or more labels in front of
// base.
func covers(pattern, host string) bool {
	host = normalise(host)
	if base, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+base)
	}
	return pattern == host
}

// hostOf returns a host name that pattern matches: the name itself, or a
// name one label under a wildcard's base.
func hostOf(pattern string) string {
	if base, ok := strings.CutPrefix(pattern, "*."); ok {
		return "q." + base
	}
	return pattern
}

// desc describes r in failure messages.
func desc(r router.Route) string {
	s := fmt.Sprintf("%s %s %q (%s/%s)", r.Identity, r.Proto, r.Name+r.Path, r.SessionID, r.TunnelID)
	if r.StripPrefix {
		s += " strip"
	}
	if r.Pool {
		s += " pool"
	}
	if r.Policy != "" {
		// Never the policy itself: it holds secrets.
		s += fmt.Sprintf(" policy(%d bytes)", len(r.Policy))
	}
	return s
}

func descAll(routes []router.Route) string {
	if len(routes) == 0 {
		return "no routes"
	}
	s := make([]string, len(routes))
	for i, r := range routes {
		s[i] = desc(r)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// holds describes the state of r bound, for refuse.
func holds(r router.Route) string {
	return fmt.Sprintf("%s holds %s %q", r.Identity, r.Proto, r.Name)
}
