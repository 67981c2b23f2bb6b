package limits

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
	type endpoint struct{ proto, name string }
	q := &Quotas[endpoint]{PerSource: 2}
	a, b, c := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/32"), netip.MustParsePrefix("192.0.2.3/32")
	x := Owner{"anonymous-x", a}
	app := endpoint{"http", "app.example.test"}
	take := func(o Owner, name endpoint) *Kept {
		t.Helper()
		took, broken, max := q.Take(o, name, now)
		if broken != QuotaNone {
			t.Fatalf("%s from %s: quota %d (at most %d) broken", o.Identity, o.Source, broken, max)
		}
		return took
	}
	refused := func(o Owner, name endpoint) bool {
		_, broken, _ := q.Take(o, name, now)
		return broken != QuotaNone
	}
	check := func(when string, total, fromA int, kept bool) {
		t.Helper()
		n, fromSource, _ := q.Counts(a, now)
		isKept := q.IsKept(app, now)
		if n != total || fromSource != fromA || isKept != kept {
			t.Fatalf("%s: total %d, from a %d, app kept %v; want %d, %d, %v", when, n, fromSource, isKept, total, fromA, kept)
		}
	}

	take(x, app)
	take(x, app) // two routes of app's pool
	q.Keep(x, app, now.Add(time.Minute), now)
	q.Keep(x, app, now.Add(2*time.Minute), now)
	check("x's session ended, app kept twice", 1, 1, true)
	take(Owner{"anonymous-z", a}, endpoint{})
	if !refused(Owner{"anonymous-w", a}, endpoint{}) {
		t.Fatal("a bind from a past its quota, app kept, was granted")
	}
	now = now.Add(time.Minute + time.Second)
	check("past the first keeping, not the second", 2, 2, true)

	// x, now at b, which another anonymous agent holds its quota of:
	// taking app back is refused, and app stays kept, counted at a.
	take(Owner{"anonymous-y", b}, endpoint{})
	take(Owner{"anonymous-y", b}, endpoint{})
	if !refused(Owner{"anonymous-x", b}, app) {
		t.Fatal("x, from b at its quota, took app back")
	}
	check("a take back refused", 4, 2, true)

	// x, now at c, takes app back; the bind fails: app is kept again.
	xc := Owner{"anonymous-x", c}
	took := take(xc, app)
	if took == nil {
		t.Fatal("x took app back, and nothing kept was returned")
	}
	check("app taken back", 4, 1, false)
	q.Give(xc, 1)
	q.KeepAgain(app, *took, now)
	check("the bind that took app back failed", 4, 2, true)

	now = now.Add(time.Minute)
	check("app lapsed", 3, 1, false)
	take(xc, endpoint{})
	if took := take(xc, app); took != nil {
		t.Fatalf("a bind of app once it lapsed took %+v back", took)
	}
	q.Give(xc, 1)
	q.KeepAgain(app, Kept{x, now.Add(-time.Second)}, now)
	check("a name that lapsed, not kept again", 4, 1, false)
}
