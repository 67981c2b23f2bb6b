package etcdrouter

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// lookupPath calls r's LookupPath for a request's raw path, cleaned.
func lookupPath(t testing.TB, r *Router, proto, host, raw string) []router.Route {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	routes, err := r.LookupPath(ctx, proto, host, router.CleanPath(raw))
	if err != nil {
		t.Fatalf("LookupPath(%q, %q, %q): %v", proto, host, raw, err)
	}
	return routes
}

// TestPathsAcrossEdges checks that the routes of a name's paths are shared
// as the name is: edge-a binds the whole name and /api (stripped) of it,
// and edge-b, and an edge that loads the store afresh, route a request by
// its path to the route of edge-a it is under, Path and StripPrefix as
// bound; the keys of a path are under "p/", where an edge of before paths
// does not look.
func TestPathsAcrossEdges(t *testing.T) {
	prefix := uniquePrefix(t)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-b"})
	root := router.Route{Proto: "https", Name: "app.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	api := router.Route{Proto: "https", Name: "app.example.test", Path: "/api/", StripPrefix: true, Identity: "alice", SessionID: "s2", TunnelID: "t2"}
	bind(t, a, root)
	bind(t, a, api)
	api.Path = "/api" // as stored
	routesTo := func(r *Router, raw string, want router.Route) func() bool {
		return func() bool {
			got := lookupPath(t, r, "https", "app.example.test", raw)
			return len(got) == 1 && got[0] == at(want, "edge-a")
		}
	}
	testwait.Within(t, callTimeout, "edge-b routes /api/x to edge-a's /api", routesTo(b, "/api/x", api))
	for raw, want := range map[string]router.Route{"/": root, "/apix": root, "//api/": api, "/api/../x": root} {
		if !routesTo(b, raw, want)() {
			t.Errorf("edge-b: LookupPath(%q) = %+v; want %+v", raw, lookupPath(t, b, "https", "app.example.test", raw), at(want, "edge-a"))
		}
	}
	if got := lookup(t, b, "https", "app.example.test"); len(got) != 2 {
		t.Errorf("edge-b: Lookup = %+v; want the routes of both paths", got)
	}

	// Another identity takes no path of the name, through either edge.
	bob := router.Route{Proto: "https", Name: "app.example.test", Path: "/bob", Identity: "bob", SessionID: "s3", TunnelID: "t3"}
	if err := tryBind(b, bob); err == nil {
		t.Fatal("edge-b: bob bound a path of alice's name")
	}

	// The store holds the path's route under p/, which the cache of an
	// edge started afresh loads.
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := sharedClient.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/https/app.example.test/p/%2Fapi/r/edge-a/s2/t2") {
			found = true
		}
	}
	if !found {
		t.Errorf("no key of the route of /api under p/%%2Fapi/r/ among %d keys", len(resp.Kvs))
	}
	c := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-c"})
	if !routesTo(c, "/api", api)() {
		t.Errorf("edge-c, loaded afresh: LookupPath(/api) = %+v; want %+v", lookupPath(t, c, "https", "app.example.test", "/api"), at(api, "edge-a"))
	}

	// Unbound through edge-a with a reservation: gone on edge-b, its
	// requests back to the whole name's route, and still alice's.
	unbind(t, a, api, callTimeout)
	testwait.Within(t, callTimeout, "edge-b routes /api/x to the whole name once /api went", routesTo(b, "/api/x", root))
	unbind(t, a, root, 0)
	if err := tryBind(b, bob); err == nil {
		t.Fatal("edge-b: bob bound a path of a name whose /api is reserved for alice")
	}
}
