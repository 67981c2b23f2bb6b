package acme

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// The ACME order budget: how many orders the edge may place with its CA,
// in all and for the names of each owner (an identity, or every anonymous
// agent together). Every bucket is a token bucket as large as its budget
// that refills evenly over its period, as Let's Encrypt counts its own
// limits. What the buckets owe is kept in the Cache (see budgetRecord) and
// read at the start, so that a restart does not give it back.

const week = 7 * 24 * time.Hour

// Budgets that can refuse an order, as log lines name them.
const (
	budgetHour     = "orders_per_hour"     // ACME.OrdersPerHour: every order of the edge
	budgetWeek     = "orders_per_week"     // ACME.OrdersPerWeek: first certificates of the edge
	budgetIdentity = "orders_per_identity" // ACME.OrdersPerIdentity: one owner's first certificates per hour
	budgetShare    = "identity_share"      // ACME.IdentityShare: one owner's first certificates per week
)

// maxBudgetOwners bounds the owners whose budgets are remembered; past it,
// those whose buckets are full again are forgotten (as good as new).
const maxBudgetOwners = 1 << 16

// orderBudget decides whether an order may be placed now.
type orderBudget struct {
	hour, week       *bucket // nil: no bound
	perHour, perWeek int     // an owner's first certificates; 0: no bound
	mu               sync.Mutex
	owners           map[string]*ownerBudget
	taken            uint64 // orders taken, ever: a record newer than another has more
}

// ownerBudget is one owner's buckets; nil fields are not bounded.
type ownerBudget struct{ hour, week *bucket }

func newOrderBudget(c acmeConfig) *orderBudget {
	b := &orderBudget{perHour: c.ordersPerIdentity, perWeek: c.identityWeek}
	if c.ordersPerHour > 0 {
		b.hour = newBucket(c.ordersPerHour, time.Hour)
	}
	if c.ordersPerWeek > 0 {
		b.week = newBucket(c.ordersPerWeek, week)
	}
	return b
}

// bucket is a token bucket of n orders that refills one order every
// period/n, kept as the time it is full again (the generic cell rate
// algorithm): what it owes at a time is how many refills that is away.
type bucket struct {
	n      int
	every  time.Duration // one order refills in this
	fullAt time.Time     // full from then on (zero: full)
}

// newBucket returns a full bucket of n orders that refills n per period.
func newBucket(n int, period time.Duration) *bucket {
	return &bucket{n: n, every: max(period/time.Duration(n), 1)}
}

// owed returns the orders taken from b that have not refilled at now.
func (b *bucket) owed(now time.Time) float64 {
	if !b.fullAt.After(now) {
		return 0
	}
	return float64(b.fullAt.Sub(now)) / float64(b.every)
}

// wait returns how long from now until b has an order to give: 0 if it
// has one.
func (b *bucket) wait(now time.Time) time.Duration {
	if !b.fullAt.After(now) {
		return 0
	}
	return max(b.fullAt.Sub(now)-time.Duration(b.n-1)*b.every, 0)
}

// take takes an order from b.
func (b *bucket) take(now time.Time) {
	b.fullAt = later(b.fullAt, now).Add(b.every)
}

// owe makes b owe owed orders (at most n) at the time at.
func (b *bucket) owe(owed float64, at time.Time) {
	owed = min(owed, float64(b.n))
	if owed > 0 {
		b.fullAt = at.Add(time.Duration(owed * float64(b.every)))
	}
}

// budgetRefusal says which budget refused an order, and when it has a
// token again.
type budgetRefusal struct {
	budget string
	wait   time.Duration
}

// take spends one order of owner's: a first certificate (first) counts
// against every budget, a renewal against the edge's hourly one alone.
// It returns the budget that refused, if one did, and spends nothing then;
// spent names the budgets this order emptied.
func (b *orderBudget) take(owner string, first bool, now time.Time) (refused *budgetRefusal, spent []string) {
	type named struct {
		name string
		b    *bucket
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var ls []named
	if first {
		ob := b.ownerLocked(owner, now)
		ls = append(ls, named{budgetIdentity, ob.hour}, named{budgetShare, ob.week}, named{budgetWeek, b.week})
	}
	ls = append(ls, named{budgetHour, b.hour})
	for _, n := range ls {
		if n.b == nil {
			continue
		}
		if wait := n.b.wait(now); wait > 0 {
			return &budgetRefusal{n.name, wait}, nil
		}
	}
	for _, n := range ls {
		if n.b == nil {
			continue
		}
		n.b.take(now)
		if n.b.wait(now) > 0 {
			spent = append(spent, n.name)
		}
	}
	b.taken++
	return nil, spent
}

// ownerLocked returns owner's buckets, new ones (full) for an owner not
// seen lately.
func (b *orderBudget) ownerLocked(owner string, now time.Time) *ownerBudget {
	if b.perHour == 0 && b.perWeek == 0 {
		return &ownerBudget{}
	}
	if ob := b.owners[owner]; ob != nil {
		return ob
	}
	if len(b.owners) >= maxBudgetOwners {
		b.sweepLocked(now)
	}
	ob := &ownerBudget{}
	if b.perHour > 0 {
		ob.hour = newBucket(b.perHour, time.Hour)
	}
	if b.perWeek > 0 {
		ob.week = newBucket(b.perWeek, week)
	}
	if b.owners == nil {
		b.owners = map[string]*ownerBudget{}
	}
	b.owners[owner] = ob
	return ob
}

// sweepLocked forgets the owners whose buckets are full again, and, if
// that is not enough, any others, so that the map stays bounded.
func (b *orderBudget) sweepLocked(now time.Time) {
	full := func(l *bucket) bool { return l == nil || l.owed(now) == 0 }
	for owner, ob := range b.owners {
		if full(ob.hour) && full(ob.week) {
			delete(b.owners, owner)
		}
	}
	for owner := range b.owners {
		if len(b.owners) < maxBudgetOwners*3/4 {
			break
		}
		delete(b.owners, owner)
	}
}

// budgetRecord is what the budgets owe, as kept in the Cache under
// budgetKey: for each bucket, the orders taken from it that had not
// refilled at At. A bucket that owes nothing is left out. Read back, the
// orders refill from At on, at the rates of the edge that reads it.
type budgetRecord struct {
	Version int                    `json:"version"`
	At      time.Time              `json:"at"`
	Hour    float64                `json:"orders_per_hour,omitempty"`
	Week    float64                `json:"orders_per_week,omitempty"`
	Owners  map[string]ownerRecord `json:"owners,omitempty"`
}

// ownerRecord is what one owner's buckets owe.
type ownerRecord struct {
	Hour float64 `json:"orders_per_identity,omitempty"`
	Week float64 `json:"identity_share,omitempty"`
}

// budgetRecordVersion is the version of budgetRecord this edge writes and
// reads.
const budgetRecordVersion = 1

// Bounds of a record read back: larger ones are refused whole.
const (
	maxBudgetRecord      = 64 << 20 // bytes
	maxBudgetOwnerLength = 4096     // bytes of an owner's name
)

// errBudgetRecord: the record of the budgets in the Cache is not one this
// edge can read.
var errBudgetRecord = errors.New("not a record of ACME order budgets")

// record returns what the budgets owe at now, encoded, and the count of
// orders taken that it includes.
func (b *orderBudget) record(now time.Time) ([]byte, uint64, error) {
	b.mu.Lock()
	r := budgetRecord{Version: budgetRecordVersion, At: now.UTC().Round(0)}
	owed := func(l *bucket) float64 {
		if l == nil {
			return 0
		}
		return l.owed(now)
	}
	r.Hour, r.Week = owed(b.hour), owed(b.week)
	for owner, ob := range b.owners {
		o := ownerRecord{owed(ob.hour), owed(ob.week)}
		if o == (ownerRecord{}) {
			continue
		}
		if r.Owners == nil {
			r.Owners = map[string]ownerRecord{}
		}
		r.Owners[owner] = o
	}
	taken := b.taken
	b.mu.Unlock()
	enc, err := json.Marshal(r)
	return enc, taken, err
}

// parseBudgetRecord reads a record that record wrote. Anything else (not
// JSON, another version, no time, a count that is negative or not finite,
// an empty or overlong owner, too many owners, too many bytes) is an error
// wrapping errBudgetRecord, and nothing of it is used.
func parseBudgetRecord(enc []byte) (*budgetRecord, error) {
	bad := func(format string, args ...any) (*budgetRecord, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{errBudgetRecord}, args...)...)
	}
	if len(enc) > maxBudgetRecord {
		return bad("%d bytes, more than %d", len(enc), maxBudgetRecord)
	}
	var r budgetRecord
	if err := json.Unmarshal(enc, &r); err != nil {
		return bad("%v", err)
	}
	if r.Version != budgetRecordVersion {
		return bad("version %d, want %d", r.Version, budgetRecordVersion)
	}
	if r.At.IsZero() {
		return bad("no time")
	}
	if len(r.Owners) > maxBudgetOwners {
		return bad("%d owners, more than %d", len(r.Owners), maxBudgetOwners)
	}
	valid := func(owed float64) bool { return owed >= 0 && !math.IsInf(owed, 0) && !math.IsNaN(owed) }
	if !valid(r.Hour) || !valid(r.Week) {
		return bad("orders owed %v and %v", r.Hour, r.Week)
	}
	for owner, o := range r.Owners {
		if owner == "" || len(owner) > maxBudgetOwnerLength {
			return bad("an owner's name of %d bytes", len(owner))
		}
		if !valid(o.Hour) || !valid(o.Week) {
			return bad("orders owed %v and %v by %q", o.Hour, o.Week, owner)
		}
	}
	return &r, nil
}

// restore makes the budgets owe what r says they owed at r.At (or at
// now, if r.At is later), each at most as much as it holds: what they owe
// is then refilled since.
func (b *orderBudget) restore(r *budgetRecord, now time.Time) {
	at := r.At
	if at.After(now) {
		at = now
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	owe := func(l *bucket, owed float64) {
		if l != nil {
			l.owe(owed, at)
		}
	}
	owe(b.hour, r.Hour)
	owe(b.week, r.Week)
	if b.perHour == 0 && b.perWeek == 0 {
		return
	}
	for owner, o := range r.Owners {
		if len(b.owners) >= maxBudgetOwners {
			break
		}
		ob := b.ownerLocked(owner, now)
		owe(ob.hour, o.Hour)
		owe(ob.week, o.Week)
	}
}
