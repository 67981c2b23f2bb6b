package routertest

import (
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// testPools checks rule 3: routes of one identity share a name only when
// all of them ask to, and Lookup hands a pool out round robin.
func testPools(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	const name = "pool.example.test"
	p1, p2 := pooled(alice, "http", name), pooled(alice, "http", name)
	h.bind("a free name", p1)
	h.bind(rule3+": the same identity, both asking to pool", p2)
	h.expect(rule3+": a pool of two", "http", name, p1, p2)
	checkRoundRobin(h, "http", name, 2)

	var msgs []string
	for _, c := range []struct {
		rule string
		r    router.Route
	}{
		{rule3 + ": the new route did not ask to share", route(alice, "http", name)},
		{rule3 + ": a pool is one identity's (another owner)", pooled(bob, "http", name)},
		{rule3 + ": a pool is one identity's (another owner)", route(bob, "http", name)},
	} {
		if err := h.refuse(c.rule, "alice holds a pool of "+name, c.r); err != nil {
			msgs = append(msgs, err.Error())
		}
		h.expect(c.rule+": a refused Bind leaves the pool as it was", "http", name, p1, p2)
	}

	// A pool goes round robin over every route it has.
	p3 := pooled(alice, "http", name)
	h.bind(rule3+": the same identity, all asking to pool", p3)
	h.expect(rule3+": a pool of three", "http", name, p1, p2, p3)
	checkRoundRobin(h, "http", name, 3)

	// The existing route did not ask to share: nothing joins it, and a
	// route that did not ask to share is joined by nothing.
	const solo = "solo.example.test"
	s := route(alice, "http", solo)
	h.bind("a free name", s)
	for _, c := range []struct {
		rule string
		r    router.Route
	}{
		{rule3 + ": the existing route did not ask to share", pooled(alice, "http", solo)},
		{rule3 + ": neither route asked to share", route(alice, "http", solo)},
		{rule3 + ": another owner", pooled(bob, "http", solo)},
	} {
		if err := h.refuse(c.rule, holds(s)+" without Pool", c.r); err != nil {
			msgs = append(msgs, err.Error())
		}
		h.expect(c.rule+": a refused Bind leaves the route as it was", "http", solo, s)
	}
	t.Logf("ErrNameTaken messages: %q", msgs)

	// A pool has one traffic policy: a route declaring another (or none,
	// beside routes that declare one) does not join it; one declaring the
	// same does, and Lookup returns it as bound, policy included.
	const guarded = "guarded.example.test"
	g1 := withPolicy(pooled(alice, "https", guarded), `{"basic_auth":{"credentials":["ann:s3cret"]}}`)
	h.bind("a free name", g1)
	var policyMsgs []string
	for _, c := range []struct {
		why string
		r   router.Route
	}{
		{"another policy", withPolicy(pooled(alice, "https", guarded), `{"basic_auth":{"credentials":["bob:other"]}}`)},
		{"no policy", pooled(alice, "https", guarded)},
	} {
		if err := h.refuse(rule3+": a pool has one policy ("+c.why+")", holds(g1)+" with a policy", c.r); err != nil {
			policyMsgs = append(policyMsgs, err.Error())
		}
		h.expect(rule3+": a refused Bind leaves the pool as it was", "https", guarded, g1)
	}
	g2 := withPolicy(pooled(alice, "https", guarded), g1.Policy)
	h.bind(rule3+": the same identity, both asking to pool, the same policy", g2)
	h.expect(rule3+": a pool of two with one policy", "https", guarded, g1, g2)
	t.Logf("ErrNameTaken messages for policies: %q", policyMsgs)

	// Rule 3 is per Proto and Name: the same identity holds the same name
	// over another protocol, pooled or not, beside a pool.
	st := route(alice, "tls", name)
	h.bind(rule3+": pools are per protocol", st)
	h.bind(rule3+": pools are per protocol", pooled(alice, "https", solo))
	h.expect(rule3+": pools are per protocol", "tls", name, st)
	h.expect(rule3+": pools are per protocol", "http", name, p1, p2, p3)
}

// checkRoundRobin checks that n lookups in a row of a pool of n routes
// start with each of them once: round robin.
func checkRoundRobin(h *harness, proto, host string, n int) {
	h.t.Helper()
	var firsts []router.Route
	for range 3 * n {
		routes := h.lookup(proto, host)
		if len(routes) != n {
			h.t.Errorf("%s: Lookup(%q, %q) = %s; want the %d routes of the pool", ruleRR, proto, host, descAll(routes), n)
			return
		}
		firsts = append(firsts, routes[0])
	}
	for i := 0; i+n <= len(firsts); i++ {
		seen := map[string]bool{}
		for _, r := range firsts[i : i+n] {
			seen[r.TunnelID] = true
		}
		if len(seen) != n {
			h.t.Errorf("%s: the first routes of %d lookups in a row of a pool of %d were %s; want each route of the pool once", ruleRR, n, n, descAll(firsts[i:i+n]))
			return
		}
	}
}

// testUnbind checks that Unbind removes exactly the route it names, and that
// a name whose last route went with no reservation is free at once.
func testUnbind(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)

	// One route of a pool goes; the other stays, and nothing is reserved.
	const name = "pool.example.test"
	p1, p2 := pooled(alice, "http", name), pooled(alice, "http", name)
	h.bind("a free name", p1)
	h.bind(rule3, p2)
	h.unbind(p1, 0)
	for range 3 {
		h.expect(ruleUnbind+": the other route of the pool stays", "http", name, p2)
	}
	h.unbind(p1, 0)
	h.expect(ruleUnbind+": unbinding an absent route removes nothing", "http", name, p2)

	// Only the route with r's Proto, Name, SessionID and TunnelID goes.
	for _, r := range []router.Route{
		{Proto: p2.Proto, Name: p2.Name, SessionID: p2.SessionID, TunnelID: "other-tunnel", Identity: alice},
		{Proto: p2.Proto, Name: p2.Name, SessionID: "other-session", TunnelID: p2.TunnelID, Identity: alice},
		{Proto: "tls", Name: p2.Name, SessionID: p2.SessionID, TunnelID: p2.TunnelID, Identity: alice},
		{Proto: p2.Proto, Name: "other.example.test", SessionID: p2.SessionID, TunnelID: p2.TunnelID, Identity: alice},
	} {
		h.unbind(r, 0)
		h.expect(ruleUnbind+": Unbind("+desc(r)+") removes only that route", "http", name, p2)
	}
	h.refuse(rule2, holds(p2), route(bob, "http", name))

	// Unbinding a route that is not the last of its name reserves nothing.
	const reserved = "reserve.example.test"
	q1, q2 := pooled(alice, "http", reserved), pooled(alice, "http", reserved)
	h.bind("a free name", q1)
	h.bind(rule3, q2)
	h.unbind(q1, time.Hour)
	h.expect(ruleUnbind+": the other route of the pool stays", "http", reserved, q2)
	h.unbind(q2, 0)
	h.expect(ruleUnbind+": the last route went", "http", reserved)
	h.bind(rule4+": only the last route of a name leaves a reservation; the last went with none", route(bob, "http", reserved))

	// The last route gone with no reservation, the name and its tree are
	// free at once, over every protocol.
	const free = "free.example.test"
	f := route(alice, "http", free)
	h.bind("a free name", f)
	h.unbind(f, 0)
	h.expect(ruleUnbind+": the last route went", "http", free)
	h.bind(rule1+": the last route went, with no reservation", route(bob, "tls", free))
	h.bind(rule2+": the last route went, with no reservation", route(bob, "http", free))
	w := route(alice, "http", "*.tree.example.test")
	h.bind("a free name", w)
	h.unbind(w, 0)
	h.bind(rule2+": the last route of a wildcard went, with no reservation", route(bob, "http", "x.tree.example.test"))

	// A name stays its owner's while any protocol holds it, or any name in
	// its tree.
	const both = "both.example.test"
	bh, bt := route(alice, "http", both), route(alice, "tls", both)
	h.bind("a free name", bh)
	h.bind(rule1, bt)
	h.unbind(bh, 0)
	h.expect(ruleUnbind, "http", both)
	h.expect(ruleUnbind+": a route of another protocol stays", "tls", both, bt)
	h.refuse(rule1+": the owner still holds the name over tls", holds(bt)+" (its http route went)", route(bob, "http", both))
	h.unbind(bt, 0)
	h.bind(rule1+": the last route went, over every protocol", route(bob, "http", both))

	nest, under := route(alice, "http", "nest.example.test"), route(alice, "http", "x.nest.example.test")
	h.bind("a free name", nest)
	h.bind(rule2+": within its own tree", under)
	h.unbind(nest, 0)
	h.refuse(rule2+": the owner still holds a name under it", holds(under)+" (nest.example.test went)", route(bob, "http", "nest.example.test"))
	h.refuse(rule2+": the owner still holds a name under it", holds(under)+" (nest.example.test went)", route(bob, "http", "*.nest.example.test"))
	h.unbind(under, 0)
	h.bind(rule2+": the last route of the tree went", route(bob, "http", "*.nest.example.test"))
}
