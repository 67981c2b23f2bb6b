package routertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// ruleRevoke names the revocations of identities in failure messages.
const ruleRevoke = "Revoker (identities revoked until a time)"

// testRevocations checks router.Revoker: an identity revoked until a time
// is revoked until then, and only it; revoking it again for less keeps
// the later time; a revocation that lapsed is gone.
func testRevocations(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	rv, ok := h.r.(router.Revoker)
	if !ok {
		t.Skip("the router is not a router.Revoker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	revoked := func(id string) bool {
		t.Helper()
		got, err := rv.Revoked(ctx, id)
		if err != nil {
			t.Fatalf("Revoked(%q) = %v", id, err)
		}
		return got
	}
	revoke := func(id string, until time.Time) {
		t.Helper()
		if err := rv.Revoke(ctx, id, until); err != nil {
			t.Fatalf("Revoke(%q, %v) = %v; want success", id, until, err)
		}
	}
	if revoked(alice) {
		t.Errorf("%s: an identity never revoked is revoked", ruleRevoke)
	}
	revoke(alice, time.Now().Add(longReserve))
	if !revoked(alice) {
		t.Errorf("%s: %s revoked for a minute is not revoked", ruleRevoke, alice)
	}
	if revoked(bob) {
		t.Errorf("%s: %s revoked; %s is too", ruleRevoke, alice, bob)
	}
	revoke(alice, time.Now().Add(shortReserve))
	revoke(alice, time.Now().Add(-time.Minute))
	if !revoked(alice) {
		t.Errorf("%s: %s revoked for a minute, then for less, then until a time past, is no longer revoked; want the latest time kept", ruleRevoke, alice)
	}
	if err := rv.Revoke(ctx, "", time.Now().Add(longReserve)); !errors.Is(err, router.ErrInvalidIdentity) {
		t.Errorf("%s: Revoke of an empty identity = %v; want an error wrapping router.ErrInvalidIdentity", ruleRevoke, err)
	}
	revoke(carol, time.Now().Add(-time.Second))
	if revoked(carol) {
		t.Errorf("%s: %s revoked until a time past is revoked", ruleRevoke, carol)
	}

	// A revocation lapses: polled, as a reservation's lapse is.
	revoke(bob, time.Now().Add(shortReserve))
	if !revoked(bob) {
		t.Errorf("%s: %s revoked for %v is not revoked at once", ruleRevoke, bob, shortReserve)
	}
	deadline := time.Now().Add(shortReserve + lapseGrace)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for revoked(bob) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s revoked for %v is still revoked %v after it lapsed", ruleRevoke, bob, shortReserve, lapseGrace)
		}
		<-tick.C
	}
	if !revoked(alice) {
		t.Errorf("%s: %s, revoked for a minute, lapsed with %s", ruleRevoke, alice, bob)
	}
}
