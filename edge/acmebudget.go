package edge

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// The ACME order budget: how many orders the edge may place with its CA,
// in all and for the names of each owner (an identity, or the source
// address of anonymous agents). Every bucket is a token bucket as large as
// its budget that refills evenly over its period, as Let's Encrypt counts
// its own limits.

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
	hour, week       *rate.Limiter // nil: no bound
	perHour, perWeek int           // an owner's first certificates; 0: no bound
	mu               sync.Mutex
	owners           map[string]*ownerBudget
}

// ownerBudget is one owner's buckets; nil fields are not bounded.
type ownerBudget struct{ hour, week *rate.Limiter }

func newOrderBudget(c acmeConfig) *orderBudget {
	b := &orderBudget{perHour: c.ordersPerIdentity, perWeek: c.identityWeek}
	if c.ordersPerHour > 0 {
		b.hour = bucket(c.ordersPerHour, time.Hour)
	}
	if c.ordersPerWeek > 0 {
		b.week = bucket(c.ordersPerWeek, week)
	}
	return b
}

// bucket returns a full token bucket of n tokens that refills n per period.
func bucket(n int, period time.Duration) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(float64(n)/period.Seconds()), n)
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
		l    *rate.Limiter
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
		if n.l == nil {
			continue
		}
		if tokens := n.l.TokensAt(now); tokens < 1 {
			return &budgetRefusal{n.name, time.Duration((1 - tokens) / float64(n.l.Limit()) * float64(time.Second))}, nil
		}
	}
	for _, n := range ls {
		if n.l == nil {
			continue
		}
		n.l.AllowN(now, 1)
		if n.l.TokensAt(now) < 1 {
			spent = append(spent, n.name)
		}
	}
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
		ob.hour = bucket(b.perHour, time.Hour)
	}
	if b.perWeek > 0 {
		ob.week = bucket(b.perWeek, week)
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
	full := func(l *rate.Limiter) bool { return l == nil || l.TokensAt(now) >= float64(l.Burst()) }
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
