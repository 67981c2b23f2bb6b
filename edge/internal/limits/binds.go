package limits

import (
	"context"
	"sync"
	"time"
)

// BindGuard makes refused binds cost the one refused: each owner (an
// identity, or the source of anonymous agents) has a budget of failed
// binds, Burst at once and PerSecond after that. A failure spends from it
// whether or not there is anything left, so that failures in a row run it
// into debt; a bind of an owner in debt waits, before anything is done for
// it, until the budget is back above zero: no wait for the first Burst
// failures, then waits that grow with each failure (a backoff) up to one
// bind a PerSecond, however many sessions and streams the owner spreads
// its binds over (binds of an owner in debt wait in turn). Binds that
// succeed spend nothing. A nil *BindGuard, or one whose PerSecond is
// zero, throttles nothing.
type BindGuard struct {
	// PerSecond is the failures an owner may have per second, once Burst
	// is spent; Burst those it may have at once (below 1: 1). Set them
	// before the first use, and with Set after.
	PerSecond float64
	Burst     int

	mu     sync.Mutex
	owners map[string]*budget
}

// budget is an owner's budget of failures: tokens at last, refilled at
// PerSecond up to Burst since; below zero, a debt.
type budget struct {
	tokens float64
	last   time.Time
}

// ErrBindThrottled is Wait's answer for an owner whose debt would take
// longer to pay than the bind may wait.
var ErrBindThrottled = errThrottled{}

type errThrottled struct{}

func (errThrottled) Error() string { return "limits: too many refused binds" }

// Pass is a bind that Wait let through; Done says how it went.
type Pass struct {
	g        *BindGuard
	owner    string
	reserved bool // the wait spent a failure ahead (an owner in debt)
}

// Wait waits until owner may try a bind: at once unless its budget of
// failures is spent. A bind of an owner in debt spends its failure ahead,
// before it waits, so that binds under way at once wait in turn, one a
// PerSecond, rather than all together; Done gives it back if the bind
// succeeds. Wait reports whether it waited, and fails with
// ErrBindThrottled, without waiting, when the wait would outlast ctx, or
// with ctx's error when ctx ends first; the Pass it returns otherwise
// must be given the bind's outcome (Done).
func (g *BindGuard) Wait(ctx context.Context, owner string) (p Pass, waited bool, err error) {
	if g == nil {
		return Pass{}, false, nil
	}
	p = Pass{g: g, owner: owner}
	g.mu.Lock()
	var delay time.Duration
	if b := g.owners[owner]; b != nil && g.PerSecond > 0 {
		now := time.Now()
		if left := g.tokensLocked(b, now); left < 1 {
			b.tokens, b.last = left-1, now
			p.reserved = true
			delay = time.Duration((1 - left) / g.PerSecond * float64(time.Second))
		}
	}
	g.mu.Unlock()
	if delay <= 0 {
		return p, false, nil
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < delay {
		g.refund(owner)
		return Pass{}, true, ErrBindThrottled
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return p, true, nil
	case <-ctx.Done():
		g.refund(owner)
		return Pass{}, true, ctx.Err()
	}
}

// Done reports how the bind went: a refused bind spends one failure of
// its owner's budget, into debt if it has none left (what its wait spent
// ahead, if it waited); a bind that succeeded gives back what its wait
// spent.
func (p Pass) Done(refused bool) {
	switch {
	case p.reserved && !refused:
		p.g.refund(p.owner)
	case !p.reserved && refused:
		p.g.Failed(p.owner)
	}
}

// Failed spends one failure of owner's budget, into debt if it has none
// left: the next binds wait for it in Wait.
func (g *BindGuard) Failed(owner string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.PerSecond <= 0 {
		return
	}
	now := time.Now()
	b := g.owners[owner]
	if b == nil {
		if g.owners == nil {
			g.owners = map[string]*budget{}
		}
		if len(g.owners) >= maxTrackedSources {
			g.sweepLocked(now)
		}
		b = &budget{tokens: g.burst(), last: now}
		g.owners[owner] = b
	}
	b.tokens, b.last = g.tokensLocked(b, now)-1, now
}

// refund gives back a failure spent ahead for a bind that was not refused.
func (g *BindGuard) refund(owner string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.owners[owner]; b != nil {
		now := time.Now()
		b.tokens, b.last = min(g.tokensLocked(b, now)+1, g.burst()), now
	}
}

// tokensLocked returns b's budget at now.
func (g *BindGuard) tokensLocked(b *budget, now time.Time) float64 {
	return min(b.tokens+now.Sub(b.last).Seconds()*g.PerSecond, g.burst())
}

func (g *BindGuard) burst() float64 { return float64(max(g.Burst, 1)) }

// Set changes PerSecond and Burst: every owner's budget starts anew.
func (g *BindGuard) Set(perSecond float64, burst int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.PerSecond, g.Burst = perSecond, burst
	clear(g.owners)
}

// Owners returns how many owners the guard keeps a budget for.
func (g *BindGuard) Owners() int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.owners)
}

// sweepLocked forgets the owners whose budget is whole again, and, if
// that is not enough, any others, so that the map stays bounded.
func (g *BindGuard) sweepLocked(now time.Time) {
	for k, b := range g.owners {
		if g.tokensLocked(b, now) >= g.burst() {
			delete(g.owners, k)
		}
	}
	for k := range g.owners {
		if len(g.owners) < maxTrackedSources*3/4 {
			break
		}
		delete(g.owners, k)
	}
}
