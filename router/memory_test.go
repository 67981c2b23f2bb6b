package router

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A reservation made by Reserve holds a name, with its tree, as one left
// by Unbind does: for its identity alone, until it lapses.
func TestMemoryRouterReserve(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	m := &MemoryRouter{Clock: func() time.Time { return now }}
	alice := Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	if err := m.Reserve(ctx, alice, time.Minute); err != nil {
		t.Fatal(err)
	}
	if id, until, ok := m.Holder("http", "app.example.test"); !ok || id != "alice" || !until.Equal(now.Add(time.Minute)) {
		t.Fatalf("Holder after Reserve: %q %v %v, want alice until %v", id, until, ok, now.Add(time.Minute))
	}
	for _, name := range []string{"app.example.test", "x.app.example.test", "*.example.test"} {
		for _, proto := range []string{"http", "tls"} {
			bob := Route{Proto: proto, Name: name, Identity: "bob", SessionID: "s2", TunnelID: "t2"}
			if err := m.Bind(ctx, bob); !errors.Is(err, ErrNameTaken) {
				t.Errorf("bob binding %s %s over alice's reservation: %v, want ErrNameTaken", proto, name, err)
			}
			if err := m.Reserve(ctx, bob, time.Hour); !errors.Is(err, ErrNameTaken) {
				t.Errorf("bob reserving %s %s over alice's reservation: %v, want ErrNameTaken", proto, name, err)
			}
		}
	}
	if routes, _ := m.Lookup(ctx, "http", "app.example.test"); len(routes) != 0 {
		t.Fatalf("a reservation has routes: %v", routes)
	}
	// Its identity binds it, with or without a pool; the routes stay when
	// it is reserved again.
	if err := m.Bind(ctx, alice); err != nil {
		t.Fatalf("alice binding her reserved name: %v", err)
	}
	if err := m.Reserve(ctx, alice, time.Minute); err != nil {
		t.Fatal(err)
	}
	if id, until, ok := m.Holder("http", "app.example.test"); !ok || id != "alice" || !until.IsZero() {
		t.Fatalf("Holder with a route: %q %v %v, want alice with no end", id, until, ok)
	}
	if routes, _ := m.Lookup(ctx, "http", "app.example.test"); len(routes) != 1 {
		t.Fatalf("Reserve of a bound name: %d routes, want alice's", len(routes))
	}
	if err := m.Unbind(ctx, alice, time.Second); err != nil {
		t.Fatal(err)
	}
	if id, until, ok := m.Holder("http", "app.example.test"); !ok || id != "alice" || !until.Equal(now.Add(time.Second)) {
		t.Fatalf("Holder after Unbind with a reserve: %q %v %v", id, until, ok)
	}
	// The later of two reservations counts.
	if err := m.Reserve(ctx, alice, time.Minute); err != nil {
		t.Fatal(err)
	}
	now = now.Add(30 * time.Second)
	if _, _, ok := m.Holder("http", "app.example.test"); !ok {
		t.Fatal("the longer reservation lapsed with the shorter one")
	}
	now = now.Add(time.Minute)
	if id, _, ok := m.Holder("http", "app.example.test"); ok {
		t.Fatalf("Holder after the reservation lapsed: %q", id)
	}
	bob := Route{Proto: "http", Name: "app.example.test", Identity: "bob", SessionID: "s2", TunnelID: "t2"}
	if err := m.Bind(ctx, bob); err != nil {
		t.Fatalf("bob binding a lapsed reservation: %v", err)
	}
	if err := m.Reserve(ctx, alice, 0); err != nil {
		t.Fatalf("Reserve for no time: %v, want nothing done", err)
	}
	if err := m.Reserve(ctx, Route{Proto: "http", Name: "bad name"}, time.Minute); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("Reserve of an invalid name: %v", err)
	}
}

// TestRouteSet adds and removes routes of a pool in a random order, past
// the size where the set indexes them and back, checking it against a map.
func TestRouteSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s routeSet
	want := map[RouteKey]Route{}
	route := func(i int) Route {
		return Route{Proto: "http", Name: "pool.example.test", TunnelID: strconv.Itoa(i), SessionID: "s" + strconv.Itoa(i%7), Pool: true}
	}
	for step := range 5000 {
		r := route(rng.IntN(3 * indexAt))
		if _, ok := want[r.Key()]; ok && rng.IntN(2) == 0 {
			got, ok := s.remove(r.Key())
			if !ok || got != r {
				t.Fatalf("step %d: remove(%v) = %v, %v", step, r.Key(), got, ok)
			}
			delete(want, r.Key())
		} else if !ok {
			s.add(r)
			want[r.Key()] = r
		}
		if s.len() != len(want) {
			t.Fatalf("step %d: %d routes, want %d", step, s.len(), len(want))
		}
		if s.len() > indexAt && s.index == nil {
			t.Fatalf("step %d: %d routes and no index", step, s.len())
		}
		if s.len() == 0 && (s.list != nil || s.index != nil) {
			t.Fatalf("step %d: an empty set keeps its room", step)
		}
		for k, r := range want {
			if got, ok := s.get(k); !ok || got != r {
				t.Fatalf("step %d: get(%v) = %v, %v, want %v", step, k, got, ok, r)
			}
		}
		if _, ok := s.get(RouteKey{Tunnel: "none"}); ok {
			t.Fatalf("step %d: get of a key never added succeeded", step)
		}
	}
	if _, ok := s.remove(RouteKey{Tunnel: "none"}); ok {
		t.Fatal("remove of a key never added succeeded")
	}
}

// A Route logs without its policy, which holds secrets.
func TestRouteLogValue(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil))
	log.Info("route", "route", Route{Proto: "https", Name: "app.example.test", Identity: "alice", Policy: `{"basic_auth":{"credentials":["ann:s3cret"]}}`})
	if out := b.String(); strings.Contains(out, "s3cret") || !strings.Contains(out, "route.name=app.example.test") || !strings.Contains(out, "route.policy_bytes=45") {
		t.Errorf("logged %q", out)
	}
}
