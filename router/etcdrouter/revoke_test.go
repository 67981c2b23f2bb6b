package etcdrouter

import (
	"context"
	"testing"
	"time"
)

// TestRevocationsAcrossEdges: an identity revoked through one edge is
// revoked on another at once, and after the edge that revoked it closed.
func TestRevocationsAcrossEdges(t *testing.T) {
	prefix := uniquePrefix(t)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-b"}) // through sockets
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := a.Revoke(ctx, "anonymous-x/y", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	for _, id := range []string{"anonymous-x/y", "anonymous-x", "anonymous-x%2Fy"} {
		got, err := b.Revoked(ctx, id)
		if want := id == "anonymous-x/y"; err != nil || got != want {
			t.Errorf("edge-b: Revoked(%q) = %v, %v; want %v", id, got, err, want)
		}
	}
}
