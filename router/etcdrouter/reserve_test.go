package etcdrouter

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// TestReservationsAcrossEdges: the operator's reservation made through
// one edge holds on the others at once, outlives the edge that made it,
// is in the cache of an edge that starts later, and goes when removed
// through another edge.
func TestReservationsAcrossEdges(t *testing.T) {
	prefix := uniquePrefix(t)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-b"}) // through sockets
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	res := router.Reservation{Name: "shop.customer.test", Identity: "alice"}
	if err := a.AddReservation(ctx, res); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Reservations(ctx); err != nil || !slices.Equal(got, []router.Reservation{res}) {
		t.Fatalf("edge-a's Reservations right after AddReservation: %v, %v", got, err)
	}
	bob := router.Route{Proto: "https", Name: "shop.customer.test", Identity: "bob", SessionID: "s2", TunnelID: "t2"}
	if err := tryBind(b, bob); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("edge-b: bob's Bind of alice's reserved name = %v; want ErrNameTaken", err)
	}
	if got, ok, err := b.Reservation(ctx, "SHOP.customer.test."); err != nil || !ok || got != res {
		t.Fatalf("edge-b: Reservation = %v, %v, %v; want %v", got, ok, err, res)
	}
	testwait.Within(t, callTimeout, "edge-b's cache has the reservation made through edge-a", func() bool {
		got, _ := b.Reservations(ctx)
		return slices.Equal(got, []router.Reservation{res})
	})
	if err := b.AddReservation(ctx, router.Reservation{Name: "x.shop.customer.test", Identity: "bob"}); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("edge-b: bob's reservation under alice's = %v; want ErrNameTaken", err)
	}
	alice := router.Route{Proto: "https", Name: "shop.customer.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	bind(t, b, alice)
	unbind(t, b, alice, 0)

	// edge-a goes (its lease revoked); the reservation stays.
	a.Close()
	if err := tryBind(b, bob); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("edge-b: bob's Bind once edge-a closed = %v; want ErrNameTaken", err)
	}
	c := newRouter(t, Config{Prefix: prefix, Edge: "edge-c"})
	if got, err := c.Reservations(ctx); err != nil || !slices.Equal(got, []router.Reservation{res}) {
		t.Fatalf("edge-c, started later: Reservations = %v, %v; want %v", got, err, res)
	}
	if err := b.RemoveReservation(ctx, "shop.customer.test"); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveReservation(ctx, "shop.customer.test"); !errors.Is(err, router.ErrNoReservation) {
		t.Fatalf("RemoveReservation again = %v; want ErrNoReservation", err)
	}
	bind(t, b, bob)
	testwait.Within(t, callTimeout, "edge-c's cache has the reservation gone", func() bool {
		got, _ := c.Reservations(ctx)
		return len(got) == 0
	})
}
