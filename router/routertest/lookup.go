package routertest

import (
	"testing"
	"time"
)

// testEmptyRouter checks a router with no routes: Lookup finds nothing
// without an error, and Unbind of a route it never had is not an error and
// reserves nothing.
func testEmptyRouter(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	for _, q := range []struct{ proto, host string }{
		{"http", "abc.example.test"},
		{"https", "abc.example.test"},
		{"tls", "abc.example.test"},
		{"http", "example.test"},
		{"tcp", "20001"},
	} {
		h.expect("Lookup (no route is an empty slice and a nil error)", q.proto, q.host)
	}
	absent := []struct {
		name    string
		reserve time.Duration
	}{
		{"absent.example.test", 0},
		{"reserved.example.test", longReserve},
		{"*.absent.example.test", longReserve},
	}
	for _, a := range absent {
		r := route(alice, "http", a.name)
		if err := h.Unbind(r, a.reserve); err != nil {
			t.Errorf("Unbind: removing an absent route is not an error: Unbind(%s, %v) = %v", desc(r), a.reserve, err)
		}
		// Only the last route of a name leaves a reservation.
		h.bind(rule4+": Unbind of an absent route reserves nothing", route(bob, "http", a.name))
	}
	r := route(alice, "tcp", "20001")
	if err := h.Unbind(r, longReserve); err != nil {
		t.Errorf("Unbind: removing an absent route is not an error: Unbind(%s, %v) = %v", desc(r), longReserve, err)
	}
	h.bind(rule4+": Unbind of an absent route reserves nothing", route(bob, "tcp", "20001"))
}

// testLookup checks which routes Lookup returns: those of the most specific
// pattern of proto matching host, with the fields as bound.
func testLookup(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	wild := route(alice, "http", "*.example.test")
	wildB := route(alice, "http", "*.b.example.test")
	exact := route(alice, "http", "a.b.example.test")
	base := route(alice, "http", "example.test")
	mixed := route(alice, "http", "Mixed.Example.TEST")
	mixedWild := route(alice, "http", "*.Wild.Example.Test")
	h.bind("a first route", wild)

	// A wildcard matches one or more labels in front of its base, not the
	// base itself.
	h.expect(ruleLookup+": a wildcard matches one label", "http", "x.example.test", wild)
	h.expect(ruleLookup+": a wildcard matches several labels", "http", "x.y.z.example.test", wild)
	h.expect(ruleLookup+": a wildcard does not match its base", "http", "example.test")
	h.expect(ruleLookup+": a wildcard matches only under its base", "http", "example.testing")
	h.expect(ruleLookup+": a wildcard matches only under its base", "http", "other.test")

	h.bind("nested patterns of one identity", wildB)
	h.bind("nested patterns of one identity", exact)
	h.bind("nested patterns of one identity", base)

	// An exact name beats any wildcard; a longer wildcard beats a shorter one.
	h.expect(ruleLookup+": an exact name beats a wildcard", "http", "a.b.example.test", exact)
	h.expect(ruleLookup+": an exact name beats a wildcard", "http", "example.test", base)
	h.expect(ruleLookup+": a longer wildcard beats a shorter one", "http", "c.b.example.test", wildB)
	h.expect(ruleLookup+": a longer wildcard beats a shorter one", "http", "x.a.b.example.test", wildB)
	h.expect(ruleLookup+": a wildcard does not match its base", "http", "b.example.test", wild)
	h.expect(ruleLookup+": a wildcard matches at label boundaries only", "http", "xb.example.test", wild)
	h.expect(ruleLookup+": a wildcard matches at label boundaries only", "http", "x.xb.example.test", wild)

	// Case and one trailing dot do not matter, in lookups or in binds; the
	// routes carry the name in lower case.
	h.expect(ruleLookup+": names are compared in lower case", "http", "A.B.Example.TEST", exact)
	h.expect(ruleLookup+": names are compared without a trailing dot", "http", "a.b.example.test.", exact)
	h.expect(ruleLookup+": names are compared in lower case without a trailing dot", "http", "C.B.EXAMPLE.TEST.", wildB)
	h.bind("a name in mixed case", mixed)
	h.bind("a wildcard in mixed case", mixedWild)
	h.expect(ruleLookup+": names are compared in lower case; Route.Name is normalised", "http", "mixed.example.test", mixed)
	h.expect(ruleLookup+": names are compared in lower case; Route.Name is normalised", "http", "MIXED.example.test.", mixed)
	h.expect(ruleLookup+": names are compared in lower case; Route.Name is normalised", "http", "x.wild.example.test", mixedWild)

	// Each protocol has its routes: a lookup over tls or https does not find
	// the http routes, and the most specific pattern is that of the
	// protocol asked for.
	h.expect(ruleLookup+": a lookup finds routes of its proto only", "tls", "a.b.example.test")
	h.expect(ruleLookup+": a lookup finds routes of its proto only", "https", "a.b.example.test")
	tlsWild := route(alice, "tls", "*.b.example.test")
	h.bind("the same identity over tls", tlsWild)
	h.expect(ruleLookup+": the most specific pattern of proto", "tls", "a.b.example.test", tlsWild)
	h.expect(ruleLookup+": a lookup finds routes of its proto only", "tls", "x.example.test")
	h.expect(ruleLookup+": a lookup finds routes of its proto only", "http", "a.b.example.test", exact)

	// Every field comes back as bound, Pool included.
	p := pooled(alice, "https", "pool.example.test")
	h.bind("a route asking to pool", p)
	h.expect(ruleLookup+": routes carry Pool as bound", "https", "pool.example.test", p)
	tcp := route(alice, "tcp", "20001")
	h.bind("a tcp port", tcp)
	h.expect(ruleLookup+": a tcp route's Name is its port", "tcp", "20001", tcp)
	h.expect(ruleLookup+": a lookup finds routes of its proto only", "tcp", "20002")
}
