package acme

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// The record of the ACME order budgets is read back from the Cache, which
// a shared store or anyone with the cache directory can write: a record
// that is not one the edge wrote must be refused whole, with a clear
// error, and a valid one must never let the budgets owe more than they
// hold. The fuzz target runs with, for example,
//
//	go test -run XXX -fuzz '^FuzzBudgetRecord$' -fuzztime 2m -parallel 1 ./edge/

// budgetTestConfig is a budget of 10 orders an hour and 4 first
// certificates a week for the edge, and 3 an hour and 2 a week for each
// owner.
var budgetTestConfig = acmeConfig{ordersPerHour: 10, ordersPerWeek: 4, ordersPerIdentity: 3, identityWeek: 2}

// owedOf returns what b's buckets owe at now, by budget and owner.
func owedOf(b *orderBudget, now time.Time) map[string]float64 {
	owed := map[string]float64{}
	add := func(name string, l *bucket) {
		if l != nil && l.owed(now) > 0 {
			owed[name] = l.owed(now)
		}
	}
	add(budgetHour, b.hour)
	add(budgetWeek, b.week)
	for owner, ob := range b.owners {
		add(budgetIdentity+"/"+owner, ob.hour)
		add(budgetShare+"/"+owner, ob.week)
	}
	return owed
}

// TestBudgetRecordRoundTrip: a budget restored from its record owes what
// the budget it was written from owes, then and later, and refuses the
// same orders.
func TestBudgetRecordRoundTrip(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	b := newOrderBudget(budgetTestConfig)
	for i, owner := range []string{"alice", "alice", "bob", "anonymous agents"} {
		if refused, _ := b.take(owner, true, t0.Add(time.Duration(i)*time.Minute)); refused != nil {
			t.Fatalf("order %d refused: %v", i, refused.budget)
		}
	}
	b.take("alice", false, t0.Add(5*time.Minute)) // a renewal
	written := t0.Add(10 * time.Minute)
	enc, taken, err := b.record(written)
	if err != nil || taken != 5 {
		t.Fatalf("record: %v, %d orders taken; want 5", err, taken)
	}
	r, err := parseBudgetRecord(enc)
	if err != nil {
		t.Fatalf("parseBudgetRecord(%s): %v", enc, err)
	}
	restored := newOrderBudget(budgetTestConfig)
	later := written.Add(40 * time.Minute) // the restart
	restored.restore(r, later)
	for _, at := range []time.Time{later, later.Add(time.Hour), later.Add(3 * 24 * time.Hour)} {
		want, got := owedOf(b, at), owedOf(restored, at)
		if len(got) != len(want) {
			t.Errorf("at %v: restored owes %v, want %v", at, got, want)
			continue
		}
		for k, w := range want {
			if math.Abs(got[k]-w) > 1e-6 {
				t.Errorf("at %v: restored owes %v on %s, want %v", at, got[k], k, w)
			}
		}
	}
	for _, owner := range []string{"alice", "bob", "carol", "anonymous agents"} {
		r1, _ := b.take(owner, true, later)
		r2, _ := restored.take(owner, true, later)
		if (r1 == nil) != (r2 == nil) || r1 != nil && r1.budget != r2.budget {
			t.Errorf("%s's order: %v from the budget, %v from the restored one", owner, r1, r2)
		}
	}
}

// hostileBudgetRecords are records no edge wrote, each refused whole.
var hostileBudgetRecords = []string{
	``,
	`null`,
	`{}`,
	`[]`,
	`{"version":1}`,
	`{"version":2,"at":"2026-12-01T12:00:00Z"}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","orders_per_week":-1}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","orders_per_week":1e400}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","orders_per_week":"NaN"}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","owners":{"":{"identity_share":1}}}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","owners":{"a":{"identity_share":-0.5}}}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","owners":{"a":[1,2]}}`,
	`{"version":1,"at":"not a time"}`,
	`{"version":1,"at":"2026-12-01T12:00:00Z"} trailing`,
	`{"version":1,"at":"2026-12-01T12:00:00Z","owners":{"` + strings.Repeat("o", maxBudgetOwnerLength+1) + `":{"identity_share":1}}}`,
	"\x00\xff\xfe garbage",
	`-----BEGIN EC PRIVATE KEY-----`,
}

func TestBudgetRecordHostile(t *testing.T) {
	for _, enc := range hostileBudgetRecords {
		r, err := parseBudgetRecord([]byte(enc))
		if !errors.Is(err, errBudgetRecord) || r != nil {
			t.Errorf("parseBudgetRecord(%.60q): %v, %v; want errBudgetRecord", enc, r, err)
		}
	}
	// Too many owners, too many bytes.
	owners := map[string]ownerRecord{}
	for i := range maxBudgetOwners + 1 {
		owners[fmt.Sprint(i)] = ownerRecord{Week: 1}
	}
	enc, _ := json.Marshal(budgetRecord{Version: budgetRecordVersion, At: time.Now(), Owners: owners})
	if _, err := parseBudgetRecord(enc); !errors.Is(err, errBudgetRecord) {
		t.Errorf("a record of %d owners: %v, want errBudgetRecord", len(owners), err)
	}
	if _, err := parseBudgetRecord(make([]byte, maxBudgetRecord+1)); !errors.Is(err, errBudgetRecord) {
		t.Errorf("a record of %d bytes: %v, want errBudgetRecord", maxBudgetRecord+1, err)
	}
}

// TestBudgetRecordBounded: a valid record that says the budgets owe more
// than they hold, or was written in the future, makes them owe at most
// all they hold, refilling from now: the week's budget is back within a
// week, whatever the record says.
func TestBudgetRecordBounded(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r, err := parseBudgetRecord([]byte(`{"version":1,"at":"9999-01-01T00:00:00Z","orders_per_hour":1e300,"orders_per_week":1e9,` +
		`"owners":{"alice":{"orders_per_identity":5e20,"identity_share":7}}}`))
	if err != nil {
		t.Fatal(err)
	}
	b := newOrderBudget(budgetTestConfig)
	b.restore(r, now)
	checkBudgetBounded(t, b, now)
	if refused, _ := b.take("bob", true, now); refused == nil || refused.budget != budgetWeek || refused.wait > week/4 {
		t.Errorf("bob's order after a record of the week spent: %+v, want refused by %s for at most a quarter of a week", refused, budgetWeek)
	}
	if refused, _ := b.take("bob", true, now.Add(week)); refused != nil {
		t.Errorf("bob's order a week later: refused by %s", refused.budget)
	}
}

// checkBudgetBounded fails t if a bucket of b owes more than it holds or
// waits longer than its period at now.
func checkBudgetBounded(t testing.TB, b *orderBudget, now time.Time) {
	t.Helper()
	check := func(name string, l *bucket, period time.Duration) {
		if l == nil {
			return
		}
		if owed := l.owed(now); owed < 0 || owed > float64(l.n)+1e-9 {
			t.Errorf("%s owes %v, holds %d", name, owed, l.n)
		}
		if w := l.wait(now); w < 0 || w > period {
			t.Errorf("%s waits %v, its period is %v", name, w, period)
		}
	}
	check(budgetHour, b.hour, time.Hour)
	check(budgetWeek, b.week, week)
	for owner, ob := range b.owners {
		check(budgetIdentity+"/"+owner, ob.hour, time.Hour)
		check(budgetShare+"/"+owner, ob.week, week)
	}
}

// FuzzBudgetRecord parses arbitrary bytes as a record. parseBudgetRecord
// must never panic, and must fail with errBudgetRecord or return a record
// that, restored, leaves every bucket within its bounds, and that the
// restored budget writes again as a valid record.
func FuzzBudgetRecord(f *testing.F) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	b := newOrderBudget(budgetTestConfig)
	b.take("alice", true, t0)
	b.take("anonymous agents", true, t0)
	b.take("alice", false, t0)
	valid, _, err := b.record(t0)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte(`{"version":1,"at":"2026-12-01T12:00:00Z","orders_per_hour":3.5,"owners":{"é\u0000":{"identity_share":1e-300}}}`))
	for _, enc := range hostileBudgetRecords {
		f.Add([]byte(enc))
	}
	f.Fuzz(func(t *testing.T, enc []byte) {
		r, err := parseBudgetRecord(enc)
		if err != nil {
			if !errors.Is(err, errBudgetRecord) || r != nil {
				t.Fatalf("parseBudgetRecord: %v, %v; want errBudgetRecord and no record", r, err)
			}
			return
		}
		now := t0.Add(time.Hour)
		b := newOrderBudget(budgetTestConfig)
		b.restore(r, now)
		checkBudgetBounded(t, b, now)
		again, _, err := b.record(now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseBudgetRecord(again); err != nil {
			t.Fatalf("the restored budget's record %s: %v", again, err)
		}
	})
}
