package routertest

import (
	"fmt"
	"testing"

	"github.com/tunnelkit/tunnelkit/router"
)

// testOwnership checks that a host name has one owner whatever the
// protocol, and that the owner may hold it over several protocols at once.
func testOwnership(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	a := route(alice, "http", "abc.example.test")
	h.bind("a free name", a)

	h.refuse(rule2+": another identity, the same name", holds(a), route(bob, "http", "abc.example.test"))
	h.refuse(rule2+": another identity, the same name in another case", holds(a), route(bob, "http", "ABC.Example.Test"))
	h.refuse(rule1+": another identity, the same name over tls", holds(a), route(bob, "tls", "abc.example.test"))
	h.refuse(rule1+": another identity, the same name over https", holds(a), route(bob, "https", "abc.example.test"))
	h.expect(rule1+": a refused Bind leaves no route", "http", "abc.example.test", a)
	h.expect(rule1+": a refused Bind leaves no route", "tls", "abc.example.test")
	h.expect(rule1+": a refused Bind leaves no route", "https", "abc.example.test")

	// The owner holds the name over every protocol at once, and a lookup
	// per protocol finds the route of that protocol.
	aTLS := route(alice, "tls", "abc.example.test")
	aHTTPS := route(alice, "https", "abc.example.test")
	h.bind(rule1+": the owner may hold its name over several protocols", aTLS)
	h.bind(rule1+": the owner may hold its name over several protocols", aHTTPS)
	h.expect(rule1+": a lookup per protocol", "http", "abc.example.test", a)
	h.expect(rule1+": a lookup per protocol", "tls", "abc.example.test", aTLS)
	h.expect(rule1+": a lookup per protocol", "https", "abc.example.test", aHTTPS)
	h.refuse(rule1+": another identity, while the owner holds the name over three protocols", holds(aTLS), route(bob, "tls", "abc.example.test"))

	// The other way round: held over tls, refused over http.
	c := route(carol, "tls", "def.example.test")
	h.bind("a free name", c)
	h.refuse(rule1+": another identity, the same name over http", holds(c), route(bob, "http", "def.example.test"))
	h.refuse(rule1+": another identity, the same name over https", holds(c), route(alice, "https", "def.example.test"))
	h.expect(rule1+": a refused Bind leaves no route", "http", "def.example.test")
	h.expect(rule1+": a refused Bind leaves no route", "tls", "def.example.test", c)
}

// treeConflicts are pairs of patterns of which, under rule 2, nobody else
// binds one while an identity holds the other, in either order.
var treeConflicts = []struct{ a, b string }{
	{"*.w.example.test", "*.w.example.test"},
	{"*.w.example.test", "w.example.test"},
	{"*.w.example.test", "x.w.example.test"},
	{"*.w.example.test", "*.x.w.example.test"},
	{"*.w.example.test", "a.b.w.example.test"},
	{"*.w.example.test", "*.a.b.w.example.test"},
	{"w.example.test", "w.example.test"},
	{"w.example.test", "a.b.w.example.test"},
	{"abc.example.test", "*.abc.example.test"},
	{"abc.example.test", "x.abc.example.test"},
	{"*.example.test", "x.example.test"},
	{"*.example.test", "*.a.b.example.test"},
	{"example.test", "x.example.test"},
}

// treeSiblings are pairs of patterns in separate trees: different
// identities hold them at once. Several share a suffix that is not at a
// label boundary.
var treeSiblings = []struct{ a, b string }{
	{"w.example.test", "ww.example.test"},
	{"w.example.test", "xw.example.test"},
	{"*.w.example.test", "xw.example.test"},
	{"*.w.example.test", "*.xw.example.test"},
	{"*.w.example.test", "x.xw.example.test"},
	{"abc.example.test", "bc.example.test"},
	{"abc.example.test", "*.bc.example.test"},
	{"x.example.test", "y.example.test"},
	{"*.a.w.example.test", "*.b.w.example.test"},
	{"a.w.example.test", "*.b.w.example.test"},
}

// testTrees checks rule 2: a name owns its tree, at every depth and in
// both directions, over one protocol and across protocols, and trees are
// cut at label boundaries. Each case has a router of its own.
func testTrees(t *testing.T, newRouter makeRouter) {
	protos := []struct{ a, b string }{{"http", "http"}, {"tls", "http"}, {"http", "https"}}
	for _, c := range treeConflicts {
		for i, pair := range [][2]string{{c.a, c.b}, {c.b, c.a}} {
			if i == 1 && c.a == c.b {
				continue
			}
			for _, p := range protos {
				held, other := pair[0], pair[1]
				t.Run(fmt.Sprintf("%s %s then %s %s", p.a, held, p.b, other), func(t *testing.T) {
					h := newHarness(t, newRouter)
					a := route(alice, p.a, held)
					h.bind("a free name", a)
					rule := rule2
					if p.a != p.b {
						rule = rule1 + " and " + rule2
					}
					h.refuse(rule, holds(a), route(bob, p.b, other))
					h.refuse(rule+": Pool does not share with another identity", holds(a), pooled(bob, p.b, other))
					h.expect(rule+": a refused Bind leaves no route", p.b, hostOf(normalise(other)), lookupWant(p.a, p.b, held, other, a)...)
				})
			}
		}
	}
	for _, c := range treeSiblings {
		for _, pair := range [][2]string{{c.a, c.b}, {c.b, c.a}} {
			for _, p := range protos[:2] {
				first, second := pair[0], pair[1]
				t.Run(fmt.Sprintf("%s %s beside %s %s", p.a, first, p.b, second), func(t *testing.T) {
					h := newHarness(t, newRouter)
					a := route(alice, p.a, first)
					b := route(bob, p.b, second)
					h.bind("a free name", a)
					h.bind(rule2+": "+first+" and "+second+" are in separate trees (trees are cut at label boundaries)", b)
					h.expect(ruleLookup, p.a, hostOf(first), a)
					h.expect(ruleLookup, p.b, hostOf(second), b)
				})
			}
		}
	}
	t.Run("OwnTree", func(t *testing.T) {
		h := newHarness(t, newRouter)
		names := []string{"*.w.example.test", "w.example.test", "x.w.example.test", "*.x.w.example.test", "a.b.w.example.test", "*.example.test"}
		var bound []string
		for _, n := range names {
			r := route(alice, "http", n)
			h.bind(rule2+": within its own trees an identity binds freely (holding "+fmt.Sprint(bound)+")", r)
			bound = append(bound, n)
		}
		tl := route(alice, "tls", "y.w.example.test")
		h.bind(rule1+" and "+rule2+": within its own trees an identity binds freely, over any protocol", tl)
		for _, q := range []struct{ host, pattern string }{
			{"w.example.test", "w.example.test"},
			{"x.w.example.test", "x.w.example.test"},
			{"q.x.w.example.test", "*.x.w.example.test"},
			{"q.w.example.test", "*.w.example.test"},
			{"a.b.w.example.test", "a.b.w.example.test"},
			{"c.b.w.example.test", "*.w.example.test"},
			{"q.example.test", "*.example.test"},
		} {
			got := h.lookup("http", q.host)
			if len(got) != 1 || got[0].Name != q.pattern || got[0].Identity != alice {
				t.Errorf("%s: Lookup(\"http\", %q) = %s; want alice's route of %q", ruleLookup, q.host, descAll(got), q.pattern)
			}
		}
		h.expect(ruleLookup, "tls", "y.w.example.test", tl)
		h.refuse(rule2, "alice holds *.example.test and names under it", route(bob, "tls", "zz.example.test"))
		h.refuse(rule2, "alice holds *.example.test and names under it", route(bob, "http", "*.b.w.example.test"))
	})
}

// lookupWant returns the routes Lookup(protoB, hostOf(other)) must find after
// bob was refused other while alice holds held (her route a) over protoA:
// a when a's pattern is the most specific of protoB matching that host.
func lookupWant(protoA, protoB, held, other string, a router.Route) []router.Route {
	if protoA != protoB || !covers(normalise(held), hostOf(normalise(other))) {
		return nil
	}
	return []router.Route{a}
}

// testTCPPorts checks that tcp ports are a namespace of their own: only the
// same port conflicts, and a port never conflicts with a host name.
func testTCPPorts(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	a := route(alice, "tcp", "20001")
	h.bind("a free port", a)
	h.expect(ruleLookup+": a tcp route's Name is its port", "tcp", "20001", a)
	h.refuse(ruleTCP+": another identity, the same port", holds(a), route(bob, "tcp", "20001"))
	h.refuse(ruleTCP+": another identity, the same port (Pool does not share with another identity)", holds(a), pooled(bob, "tcp", "20001"))
	h.refuse(rule3+": the same identity, the same port, without Pool", holds(a), route(alice, "tcp", "20001"))
	h.expect(ruleTCP+": a refused Bind leaves no route", "tcp", "20001", a)

	b := route(bob, "tcp", "20002")
	h.bind(ruleTCP+": different ports do not conflict", b)
	h.expect(ruleLookup, "tcp", "20002", b)

	// A port and a host name spelt the same are in different namespaces.
	bh := route(bob, "http", "20001")
	bt := route(bob, "tls", "20001")
	h.bind(ruleTCP+": a port never conflicts with a host name", bh)
	h.bind(ruleTCP+": a port never conflicts with a host name", bt)
	h.expect(ruleLookup, "http", "20001", bh)
	h.expect(ruleLookup, "tcp", "20001", a)
	c := route(carol, "http", "20003")
	h.bind("a free name", c)
	h.bind(ruleTCP+": a host name never conflicts with a port", route(alice, "tcp", "20003"))
	h.bind(ruleTCP+": a port never conflicts with a host name", route(carol, "http", "*.example.test"))

	// Pools by consent hold for ports too.
	p1, p2 := pooled(alice, "tcp", "20004"), pooled(alice, "tcp", "20004")
	h.bind("a free port", p1)
	h.bind(rule3+": the same identity, a port, both asking to pool", p2)
	h.expect(rule3+": a pool of a port", "tcp", "20004", p1, p2)
}
