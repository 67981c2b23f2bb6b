package names

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// The identities revoked outlive a restart of the record, until their
// time, and then leave it.
func TestRecordKeepsRevocations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	open := func() *Record {
		t.Helper()
		n, err := Open(dir, &router.MemoryRouter{Clock: clock}, time.Minute, log, clock)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	revoked := func(n *Record, id string) bool {
		t.Helper()
		got, err := n.Revoked(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	n := open()
	if err := n.Revoke(ctx, "anonymous-a", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := n.Revoke(ctx, "anonymous-b", now.Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	n.Stop()
	n = open()
	if !revoked(n, "anonymous-a") || !revoked(n, "anonymous-b") || revoked(n, "anonymous-c") {
		t.Fatal("after a restart: want a and b revoked, and c not")
	}
	// A crash (no Stop) two hours later: a lapsed, b not.
	now = now.Add(2 * time.Hour)
	n = open()
	if revoked(n, "anonymous-a") || !revoked(n, "anonymous-b") {
		t.Fatal("two hours later: want a's revocation lapsed and b's kept")
	}
	n.Stop()
	b, err := readRecordFile(n.path)
	if err == nil && len(b.revoked) != 1 {
		t.Fatalf("the record's revocations: %v, want b's alone (a's dropped)", b.revoked)
	}
}
