package routertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// rulePath names the contract of router.PathRouter in failure messages.
const rulePath = "LookupPath (the longest Path a request's path is under, on segment boundaries)"

// at is r with path p.
func at(r router.Route, p string) router.Route {
	r.Path = p
	return r
}

// lookupPath calls the router's LookupPath with a timeout, for a request
// whose path is raw (cleaned first, as an edge does).
func (h *harness) lookupPath(pr router.PathRouter, proto, host, raw string) []router.Route {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	routes, err := pr.LookupPath(ctx, proto, host, router.CleanPath(raw))
	if err != nil {
		h.t.Fatalf("LookupPath(%q, %q, %q) = %v; want a nil error", proto, host, router.CleanPath(raw), err)
	}
	return routes
}

// testPaths checks routes with a Path, for a Router that implements
// router.PathRouter: the paths of a name are its owner's (rule 2), each
// path of it a pool of its own (rule 3) and reserved on its own (rule 4),
// and LookupPath picks the longest path a request's is under.
func testPaths(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	pr, ok := h.r.(router.PathRouter)
	if !ok {
		t.Skip("the Router does not implement router.PathRouter")
	}
	const name = "paths.example.test"
	// Three sessions of one identity: the whole name, /api and /api/v2.
	root := route(alice, "http", name)
	api := at(route(alice, "http", name), "/api")
	v2 := at(route(alice, "http", name), "/api/v2/") // kept as /api/v2
	h.bind("a free name", root)
	h.bind(rule3+": another path of the name is not the same endpoint: no pool needed", api)
	h.bind(rule3+": another path of the name is not the same endpoint: no pool needed", v2)
	h.expect(ruleLookup+": Lookup returns the routes of every path", "http", name, root, api, v2)
	for _, c := range []struct {
		path string
		want router.Route
	}{
		{"/", root},
		{"/api", api},
		{"/api/", api},
		{"/api/x", api},
		{"/api/x/y?q=1", api}, // the query is not the edge's to pass, but it plays no part
		{"/api/v2", v2},
		{"/api/v2/x", v2},
		{"/api/v3", api},
		{"/apix", root},
		{"/API", root},
		{"/api%2Fx", root},
		{"/api%2Fv2", root},
		{"//api", api},
		{"/api/../admin", root},
		{"/x/../api/v2/", v2},
		{"/api/%2e%2e/api/v2", v2},
		{"/%61pi", api},
		{"/ap%69/v2", v2},
	} {
		got := h.lookupPath(pr, "http", name, c.path)
		if !sameRoutes(got, []router.Route{c.want}) {
			t.Errorf("%s: LookupPath(%q) = %s; want %s", rulePath, router.CleanPath(c.path), descAll(got), desc(c.want))
		}
	}
	if got := h.lookupPath(pr, "https", name, "/api"); len(got) != 0 {
		t.Errorf("%s: LookupPath of another protocol = %s; want no routes", rulePath, descAll(got))
	}

	// A name with paths and none for the whole name: a request under no
	// path finds nothing.
	const only = "only-api.example.test"
	o := at(route(alice, "https", only), "/api")
	h.bind("a free name", o)
	if got := h.lookupPath(pr, "https", only, "/"); len(got) != 0 {
		t.Errorf("%s: a path under no Path of a name without a route for the whole name: LookupPath = %s; want no routes", rulePath, descAll(got))
	}
	if got := h.lookupPath(pr, "https", only, "/api/x"); !sameRoutes(got, []router.Route{o}) {
		t.Errorf("%s: LookupPath(/api/x) = %s; want %s", rulePath, descAll(got), desc(o))
	}
	h.expect(ruleLookup+": Lookup returns the routes of every path", "https", only, o)

	// The paths of a name are its owner's: nobody else binds any path of
	// it, over any protocol of the host names' namespace.
	while := holds(root) + ", /api and /api/v2"
	h.refuse(rule2+": another identity, a path of the name", while, at(route(bob, "http", name), "/other"))
	h.refuse(rule2+": another identity, a path bound already", while, at(route(bob, "http", name), "/api"))
	h.refuse(rule2+": another identity, a path bound already, with Pool", while, at(pooled(bob, "http", name), "/api"))
	h.refuse(rule2+" and "+rule1+": another identity, a path of the name over https", while, at(route(bob, "https", name), "/b"))
	h.refuse(rule2+": another identity, a path of a name under it", while, at(route(bob, "http", "x."+name), "/b"))
	h.refuse(rule2+": another identity, a path of the wildcard over it", while, at(route(bob, "http", "*.example.test"), "/b"))

	// Each path is a pool of its own, by today's rules: another session of
	// the owner binding the same path without Pool is refused, as is a
	// path spelled otherwise that is the same once normalised.
	h.refuse(rule3+": the same identity, a path bound already, neither asking to pool", holds(api)+" /api", at(route(alice, "http", name), "/api"))
	h.refuse(rule3+": the same identity, the same path spelled otherwise", holds(api)+" /api", at(route(alice, "http", name), "/x/../%61pi/"))
	h.refuse(rule3+": the same identity, asking to pool a path whose route did not", holds(api)+" /api", at(pooled(alice, "http", name), "/api"))
	h.expect(rule3+": a refused Bind leaves the paths as they were", "http", name, root, api, v2)
	upper := at(route(alice, "http", name), "/API")
	h.bind(rule3+": paths are case-sensitive: /API is not /api", upper)

	const pooledName = "paths-pool.example.test"
	p1, p2 := at(pooled(alice, "http", pooledName), "/p"), at(pooled(alice, "http", pooledName), "/p")
	h.bind("a free name", p1)
	h.bind(rule3+": the same identity and path, both asking to pool", p2)
	if got := h.lookupPath(pr, "http", pooledName, "/p/x"); !sameRoutes(got, []router.Route{p1, p2}) {
		t.Errorf("%s: LookupPath of a pooled path = %s; want %s", rulePath, descAll(got), descAll([]router.Route{p1, p2}))
	}
	strip := at(pooled(alice, "http", pooledName), "/p")
	strip.StripPrefix = true
	h.refuse(rule3+": a pool's routes agree on StripPrefix", holds(p1)+" /p without StripPrefix", strip)
	other := at(pooled(alice, "http", pooledName), "/q")
	other.StripPrefix = true
	h.bind(rule3+": another path is another pool, with its own StripPrefix", other)
	if got := h.lookupPath(pr, "http", pooledName, "/q"); !sameRoutes(got, []router.Route{other}) {
		t.Errorf("%s: LookupPath(/q) = %s; want %s", rulePath, descAll(got), desc(other))
	}

	// A path goes with a reservation of its own, which holds the name, and
	// every path of it, for its identity; its identity binds it again.
	const resName = "paths-res.example.test"
	r1 := at(route(alice, "http", resName), "/api")
	h.bind("a free name", r1)
	h.unbind(r1, longReserve)
	while = "alice's route of " + resName + "/api went with a reservation"
	if got := h.lookupPath(pr, "http", resName, "/api"); len(got) != 0 {
		t.Errorf("%s: a reserved path has no routes: LookupPath = %s", rule4, descAll(got))
	}
	h.refuse(rule4+" and "+rule2+": another identity, the reserved path", while, at(route(bob, "http", resName), "/api"))
	h.refuse(rule4+" and "+rule2+": another identity, another path of the name", while, at(route(bob, "http", resName), "/web"))
	h.refuse(rule4+" and "+rule2+": another identity, the whole name", while, route(bob, "http", resName))
	r2 := at(route(alice, "http", resName), "/api")
	h.bind(rule4+": its identity binds the reserved path again", r2)
	h.refuse(rule3+": the path bound again did not ask to share", holds(r2)+" /api", at(route(alice, "http", resName), "/api"))

	// A reservation of one path lapses like any other.
	const lapseName = "paths-lapse.example.test"
	l := at(route(alice, "http", lapseName), "/api")
	h.bind("a free name", l)
	h.unbind(l, shortReserve)
	awaitBinds(h, time.Now().Add(shortReserve), []router.Route{at(route(bob, "http", lapseName), "/web")})

	// Unbind removes the route of its path only.
	h.unbind(api, 0)
	h.expect(ruleUnbind+": the other paths stay", "http", name, root, v2, upper)
	if got := h.lookupPath(pr, "http", name, "/api/x"); !sameRoutes(got, []router.Route{root}) {
		t.Errorf("%s: /api unbound: LookupPath(/api/x) = %s; want %s", rulePath, descAll(got), desc(root))
	}

	// A path is for http and https routes only; a Path NormalisePath
	// refuses is refused.
	for _, r := range []router.Route{
		at(route(alice, "tls", "tls-path.example.test"), "/api"),
		at(route(alice, "tcp", "20001"), "/api"),
		at(route(alice, "http", "bad-path.example.test"), "api"),
		at(route(alice, "http", "bad-path.example.test"), "/a b"),
	} {
		err := h.Bind(r)
		if err == nil {
			t.Errorf("%s: Bind(%s path %q) succeeded; want an error wrapping router.ErrInvalidPath", rulePath, desc(r), r.Path)
			h.unbind(r, 0)
			continue
		}
		if !errors.Is(err, router.ErrInvalidPath) {
			t.Errorf("%s: Bind(%s path %q) = %v; want an error wrapping router.ErrInvalidPath", rulePath, desc(r), r.Path, err)
		}
	}
	h.bind(rule4+": a refused path leaves nothing behind", route(bob, "tls", "tls-path.example.test"))
}

// testPathMoves checks that router.Mover moves a route of one path alone:
// the session's routes of the name's other paths stay.
func testPathMoves(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	m, ok := h.r.(router.Mover)
	if _, paths := h.r.(router.PathRouter); !ok || !paths {
		t.Skip("the Router does not implement router.Mover and router.PathRouter")
	}
	const name = "paths-move.example.test"
	root := route(alice, "http", name)
	api := at(root, "/api")
	api.TunnelID += "-api"
	h.bind("a free name", root)
	h.bind("another path of the session", api)
	to := moved(api)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := m.Move(ctx, to, api.SessionID); err != nil {
		t.Fatalf("%s: Move(%s, %q) = %v; want success", ruleMove, desc(to), api.SessionID, err)
	}
	h.expect(ruleMove+": the route of /api moved; that of the whole name, of the same session, stays", "http", name, root, to)
}
