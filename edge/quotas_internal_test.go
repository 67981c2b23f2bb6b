package edge

import (
	"net/netip"
	"testing"
	"time"
)

// TestKeptNamesCounted: a name kept for an identity counts against its
// owner's quotas until it lapses; kept twice (two routes of a pool
// ended), it counts once; the identity taking it back takes its place,
// unless another quota refuses the bind, which leaves it kept and
// counted; a bind that took it back and then failed keeps it again,
// unless it lapsed meanwhile.
func TestKeptNamesCounted(t *testing.T) {
	now := time.Unix(1000, 0)
	s := &Server{Clock: func() time.Time { return now }}
	s.cfg.endpointsPerSource = 2
	a, b, c := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/32"), netip.MustParsePrefix("192.0.2.3/32")
	x := endpointOwner{"anonymous-x", a}
	app := endpointKey{"http", "app.example.test"}
	counts := &s.endpointCounts
	take := func(o endpointOwner, name endpointKey) *keptName {
		t.Helper()
		took, refused := s.takeEndpoint(o, name)
		if refused != nil {
			t.Fatalf("%s from %s: %s", o.identity, o.source, refused.message)
		}
		return took
	}
	check := func(when string, total, fromA int, kept bool) {
		t.Helper()
		counts.mu.Lock()
		counts.lapseLocked(now)
		counts.mu.Unlock()
		_, isKept := counts.kept[app]
		if counts.total != total || counts.perSource[a] != fromA || isKept != kept {
			t.Fatalf("%s: total %d, from a %d, app kept %v; want %d, %d, %v", when, counts.total, counts.perSource[a], isKept, total, fromA, kept)
		}
	}

	take(x, app)
	take(x, app) // two routes of app's pool
	s.keepEndpoint(x, app, now.Add(time.Minute))
	s.keepEndpoint(x, app, now.Add(2*time.Minute))
	check("x's session ended, app kept twice", 1, 1, true)
	take(endpointOwner{"anonymous-z", a}, endpointKey{})
	if _, refused := s.takeEndpoint(endpointOwner{"anonymous-w", a}, endpointKey{}); refused == nil {
		t.Fatal("a bind from a past its quota, app kept, was granted")
	}
	now = now.Add(time.Minute + time.Second)
	check("past the first keeping, not the second", 2, 2, true)

	// x, now at b, which another anonymous agent holds its quota of:
	// taking app back is refused, and app stays kept, counted at a.
	take(endpointOwner{"anonymous-y", b}, endpointKey{})
	take(endpointOwner{"anonymous-y", b}, endpointKey{})
	if _, refused := s.takeEndpoint(endpointOwner{"anonymous-x", b}, app); refused == nil {
		t.Fatal("x, from b at its quota, took app back")
	}
	check("a take back refused", 4, 2, true)

	// x, now at c, takes app back; the bind fails: app is kept again.
	xc := endpointOwner{"anonymous-x", c}
	took := take(xc, app)
	if took == nil {
		t.Fatal("x took app back, and nothing kept was returned")
	}
	check("app taken back", 4, 1, false)
	s.giveEndpoints(xc, 1)
	s.keepAgain(app, *took)
	check("the bind that took app back failed", 4, 2, true)

	now = now.Add(time.Minute)
	check("app lapsed", 3, 1, false)
	take(xc, endpointKey{})
	if took := take(xc, app); took != nil {
		t.Fatalf("a bind of app once it lapsed took %+v back", took)
	}
	s.giveEndpoints(xc, 1)
	s.keepAgain(app, keptName{x, now.Add(-time.Second)})
	check("a name that lapsed, not kept again", 4, 1, false)
}
