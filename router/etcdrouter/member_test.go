package etcdrouter

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// isMember returns a condition: r's IsMember(id) answers want, without
// error.
func isMember(t testing.TB, r *Router, id string, want bool) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		got, err := r.IsMember(ctx, id)
		if err != nil {
			t.Fatalf("%s: IsMember(%q) = %v", r.edge, id, err)
		}
		return got == want
	}
}

// TestMembers: the edges of a prefix are members from New until Close; an
// edge that just joined is one at once, even before the cache heard of it;
// an edge of another prefix, or of none, is not.
func TestMembers(t *testing.T) {
	prefix := uniquePrefix(t)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Prefix: prefix, Edge: "edge-b"})
	newRouter(t, Config{Prefix: uniquePrefix(t), Edge: "edge-elsewhere"})

	for _, id := range []string{"edge-a", "edge-b"} {
		if !isMember(t, a, id, true)() {
			t.Fatalf("edge-a: IsMember(%q) = false right after New; want true", id)
		}
	}
	for _, id := range []string{"edge-elsewhere", "edge-c", "", "edges/edge-a"} {
		if !isMember(t, a, id, false)() {
			t.Fatalf("edge-a: IsMember(%q) = true; want false", id)
		}
	}

	// An edge that just joined: etcd knows it before the cache does.
	c := newRouter(t, Config{Prefix: prefix, Edge: "edge-c/with a slash"})
	if !isMember(t, a, "edge-c/with a slash", true)() {
		t.Fatal("edge-a: IsMember of the edge that just joined = false; want true")
	}
	testwait.Within(t, callTimeout, "in edge-b's cache", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		_, ok := b.members["edge-c/with a slash"]
		return ok
	})

	// Close revokes the lease, and the membership with it.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, callTimeout, "edge-c gone from edge-a's members", isMember(t, a, "edge-c/with a slash", false))
	testwait.Within(t, callTimeout, "edge-c gone from edge-b's members", isMember(t, b, "edge-c/with a slash", false))
	if _, err := c.IsMember(context.Background(), "edge-a"); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("IsMember after Close = %v; want net.ErrClosed", err)
	}
}
