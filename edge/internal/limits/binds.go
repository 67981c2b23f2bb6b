package limits

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// BindGuard makes refused binds cost the one refused: each owner (an
// identity, or the source of anonymous agents) has a budget of failed
// binds, Burst at once and PerSecond after that. A failure spends from it
// whether or not there is anything left, so that failures in a row run it
// into debt; a bind of an owner in debt waits, before anything is done for
// it, until the budget is back above zero: no wait for the first Burst
// failures, then waits that grow with each failure (a backoff) up to one
// bind a PerSecond, however many sessions and streams the owner spreads
// its binds over. Binds that succeed spend nothing. A nil *BindGuard, or
// one whose PerSecond is zero, throttles nothing.
type BindGuard struct {
	// PerSecond is the failures an owner may have per second, once Burst
	// is spent; Burst those it may have at once (below 1: 1). Set them
	// before the first use, and with Set after.
	PerSecond float64
	Burst     int

	mu     sync.Mutex
	owners map[string]*rate.Limiter
}

// ErrBindThrottled is Wait's answer for an owner whose debt would take
// longer to pay than the bind may wait.
var ErrBindThrottled = errThrottled{}

type errThrottled struct{}

func (errThrottled) Error() string { return "limits: too many refused binds" }

// Wait waits until owner may try a bind: at once unless its budget of
// failures is spent. It reports whether it waited, and fails with
// ErrBindThrottled, without waiting, when the wait would outlast ctx, or
// with ctx's error when ctx ends first.
func (g *BindGuard) Wait(ctx context.Context, owner string) (waited bool, err error) {
	if g == nil {
		return false, nil
	}
	g.mu.Lock()
	lim := g.owners[owner]
	var delay time.Duration
	if lim != nil && g.PerSecond > 0 {
		now := time.Now()
		if tokens := lim.TokensAt(now); tokens < 1 {
			delay = time.Duration((1 - tokens) / g.PerSecond * float64(time.Second))
		}
	}
	g.mu.Unlock()
	if delay <= 0 {
		return false, nil
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < delay {
		return true, ErrBindThrottled
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// Failed spends one failure of owner's budget, into debt if it has none
// left.
func (g *BindGuard) Failed(owner string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.PerSecond <= 0 {
		return
	}
	lim := g.owners[owner]
	if lim == nil {
		if g.owners == nil {
			g.owners = map[string]*rate.Limiter{}
		}
		if len(g.owners) >= maxTrackedSources {
			g.sweepLocked()
		}
		lim = rate.NewLimiter(rate.Limit(g.PerSecond), max(g.Burst, 1))
		g.owners[owner] = lim
	}
	// A reservation made now is the debt: it is never cancelled, and the
	// next binds wait for it in Wait.
	lim.Reserve()
}

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
func (g *BindGuard) sweepLocked() {
	burst := float64(max(g.Burst, 1))
	for k, lim := range g.owners {
		if lim.Tokens() >= burst {
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
