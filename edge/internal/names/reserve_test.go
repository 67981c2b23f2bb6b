package names

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// The operator's reservations outlive a restart, a crash and the record's
// compaction, whatever the restart grace; those removed stay removed.
func TestRecordKeepsReservations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	n, err := Open(dir, new(router.MemoryRouter), time.Minute, log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []router.Reservation{{Name: "Shop.Example.Test", Identity: "alice"}, {Name: "gone.example.test", Identity: "bob"}, {Name: "shop.customer.test", Identity: "alice"}} {
		if err := n.AddReservation(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.RemoveReservation(ctx, "gone.example.test"); err != nil {
		t.Fatal(err)
	}
	want := []router.Reservation{{Name: "shop.customer.test", Identity: "alice"}, {Name: "shop.example.test", Identity: "alice"}}
	bob := router.Route{Proto: "tls", Name: "x.shop.example.test", Identity: "bob", SessionID: "s", TunnelID: "t"}
	check := func(n *Record, when string) {
		t.Helper()
		got, err := n.Reservations(ctx)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: Reservations() = %v, %v; want %v", when, got, err, want)
		}
		if err := n.Bind(ctx, bob); !errors.Is(err, router.ErrNameTaken) {
			t.Fatalf("%s: bob binding under alice's reservation: %v, want ErrNameTaken", when, err)
		}
	}
	check(n, "before the restart")
	n.Stop()
	// A restart that keeps no name keeps the reservations.
	n, err = Open(dir, new(router.MemoryRouter), -1, log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	check(n, "after a restart")
	// Churn compacts the record; then a crash (no Stop).
	for i := range 3000 {
		r := router.Route{Proto: "http", Name: "churn.example.test", Identity: fmt.Sprint("id", i%3), SessionID: "s", TunnelID: fmt.Sprint(i)}
		n.Bind(ctx, r)
		n.Unbind(ctx, r, 0)
	}
	n, err = Open(dir, new(router.MemoryRouter), time.Minute, log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	check(n, "after compactions and a crash")
	n.Stop()
}

// readRecord reads the reservations of a record: the last line of each
// name counts, and a line cut short is skipped.
func TestReadRecordReservations(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), recordFile)
	lines := `{"reserved":"a.example.test","identity":"alice"}
{"reserved":"b.example.test","identity":"bob"}
{"reserved":"b.example.test"}
{"reserved":"c.example.test","identity":"bob"}
{"reserved":"c.example.test","identity":"carol"}
{"proto":"http","name":"live.example.test","identity":"alice"}
{"reserved":"d.exam`
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	held, reserved, err := readRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(reserved) != 2 || reserved["a.example.test"] != "alice" || reserved["c.example.test"] != "carol" {
		t.Fatalf("reservations read: %v, want a for alice and c for carol", reserved)
	}
	if len(held) != 1 {
		t.Fatalf("names held: %v, want live.example.test", held)
	}
}

// A reservation the record cannot keep is refused, and not made: it would
// be gone after a restart.
func TestRecordFailureRefusesReservations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	n, err := Open(dir, new(router.MemoryRouter), time.Minute, slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.f.Close()
	n.f, err = os.Open(filepath.Join(dir, recordFile)) // read-only: the next write fails
	n.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AddReservation(ctx, router.Reservation{Name: "shop.example.test", Identity: "alice"}); err == nil {
		t.Fatal("a reservation the record could not write was accepted")
	}
	if err := n.AddReservation(ctx, router.Reservation{Name: "shop2.example.test", Identity: "alice"}); err == nil {
		t.Fatal("a reservation after the record failed was accepted")
	}
	if got, _ := n.Reservations(ctx); len(got) != 0 {
		t.Fatalf("reservations refused, yet held: %v", got)
	}
	n.Stop()
	if err := n.AddReservation(ctx, router.Reservation{Name: "shop3.example.test", Identity: "alice"}); err == nil {
		t.Fatal("a reservation after Stop was accepted")
	}
}
