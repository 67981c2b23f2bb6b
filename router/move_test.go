package router_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// plainRouter is a Router that is not a Mover.
type plainRouter struct{ m *router.MemoryRouter }

func (p plainRouter) Bind(ctx context.Context, r router.Route) error { return p.m.Bind(ctx, r) }
func (p plainRouter) Lookup(ctx context.Context, proto, host string) ([]router.Route, error) {
	return p.m.Lookup(ctx, proto, host)
}
func (p plainRouter) Unbind(ctx context.Context, r router.Route, reserve time.Duration) error {
	return p.m.Unbind(ctx, r, reserve)
}

// Move takes a name over from the session from with a Router's Move, or,
// from a Router that is no Mover, by unbinding that session's routes and
// binding again; routes of another session or identity do not give way.
func TestMove(t *testing.T) {
	ctx := context.Background()
	for name, rt := range map[string]router.Router{"Mover": new(router.MemoryRouter), "plain": plainRouter{new(router.MemoryRouter)}} {
		old := router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
		if err := rt.Bind(ctx, old); err != nil {
			t.Fatal(err)
		}
		other := router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s3", TunnelID: "t3"}
		if err := router.Move(ctx, rt, other, "s2"); !errors.Is(err, router.ErrNameTaken) {
			t.Errorf("%s: Move from a session that holds nothing there = %v, want ErrNameTaken", name, err)
		}
		if err := router.Move(ctx, rt, other, ""); !errors.Is(err, router.ErrNameTaken) {
			t.Errorf("%s: Move from no session = %v, want ErrNameTaken", name, err)
		}
		bob := router.Route{Proto: "http", Name: "app.example.test", Identity: "bob", SessionID: "b", TunnelID: "b"}
		if err := router.Move(ctx, rt, bob, "s1"); !errors.Is(err, router.ErrNameTaken) {
			t.Errorf("%s: bob's Move from alice's session = %v, want ErrNameTaken", name, err)
		}
		moved := router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s2", TunnelID: "t2"}
		if err := router.Move(ctx, rt, moved, "s1"); err != nil {
			t.Errorf("%s: Move from the session of the name's route = %v", name, err)
		}
		if routes, _ := rt.Lookup(ctx, "http", "app.example.test"); len(routes) != 1 || routes[0] != moved {
			t.Errorf("%s: after the move, Lookup = %v, want the moved route alone", name, routes)
		}
	}
}
