package limits

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// authLogWindow is how often AuthGuard logs, in one line, the failures it
// did not log one by one.
const authLogWindow = 10 * time.Second

// AuthGuard throttles failed hellos per source, and logs them: each at
// once, with the agent's address, within a budget per source (see
// LogBudget), and the rest in aggregate every authLogWindow. A nil
// *AuthGuard throttles and logs nothing.
type AuthGuard struct {
	// PerMinute is the failures a source may have per minute, with a
	// burst as large. Zero: no throttle. Set it before the first use, and
	// with SetPerMinute after.
	PerMinute int
	// Log receives the lines. Required.
	Log   *slog.Logger
	lines LogBudget

	mu      sync.Mutex
	sources sourceLimiters
	// what the next aggregate log line reports
	unlogged, refused int
	seen              map[netip.Prefix]struct{}
	timer             *time.Timer
}

// Blocked reports whether a source spent its failures: its agent
// connections are to be closed at once.
func (g *AuthGuard) Blocked(src netip.Prefix) bool {
	if g == nil || !src.IsValid() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.PerMinute == 0 {
		return false
	}
	lim := g.sources[src]
	if lim == nil || lim.Tokens() >= 1 {
		return false
	}
	g.refused++
	g.noteLocked(src)
	return true
}

// Failed counts a failed hello from the agent at addr, of source src,
// refused with err, and logs it.
func (g *AuthGuard) Failed(addr string, src netip.Prefix, err error) {
	if g == nil {
		return
	}
	if g.lines.Allow(src) {
		g.Log.Warn("agent refused: authentication failed", "agent_addr", addr, "err", err)
	} else {
		g.mu.Lock()
		g.unlogged++
		g.noteLocked(src)
		g.mu.Unlock()
	}
	if !src.IsValid() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.PerMinute == 0 {
		return
	}
	g.sources.get(src, g.PerMinute).Allow()
}

// SetPerMinute changes PerMinute: every source's budget starts anew.
func (g *AuthGuard) SetPerMinute(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.PerMinute = n
	clear(g.sources)
}

// noteLocked counts src for the next aggregate line, which it schedules.
func (g *AuthGuard) noteLocked(src netip.Prefix) {
	if g.seen == nil {
		g.seen = map[netip.Prefix]struct{}{}
	}
	if len(g.seen) < maxTrackedSources {
		g.seen[src] = struct{}{}
	}
	if g.timer == nil {
		g.timer = time.AfterFunc(authLogWindow, g.Flush)
	}
}

// Flush logs, in one line, what was not logged one by one since the last.
func (g *AuthGuard) Flush() {
	if g == nil {
		return
	}
	g.mu.Lock()
	unlogged, refused, sources := g.unlogged, g.refused, len(g.seen)
	g.unlogged, g.refused, g.seen = 0, 0, nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.mu.Unlock()
	if unlogged+refused > 0 {
		g.Log.Warn("failed agent authentications, not logged one by one", "failures", unlogged, "closed_at_accept", refused, "sources", sources)
	}
}

// sourceLimiters is a rate.Limiter per source address, bounded: past
// maxTrackedSources, those whose budget is whole again are forgotten
// first, then any.
type sourceLimiters map[netip.Prefix]*rate.Limiter

// get returns the limiter of src, made new with perMinute events a minute
// and a burst as large.
func (l *sourceLimiters) get(src netip.Prefix, perMinute int) *rate.Limiter {
	lim := (*l)[src]
	if lim != nil {
		return lim
	}
	if *l == nil {
		*l = sourceLimiters{}
	}
	if len(*l) >= maxTrackedSources {
		l.sweep(perMinute)
	}
	lim = rate.NewLimiter(rate.Limit(float64(perMinute)/60), perMinute)
	(*l)[src] = lim
	return lim
}

// sweep forgets the sources whose budget is whole again, and, if that is
// not enough, any others, so that the map stays bounded.
func (l sourceLimiters) sweep(perMinute int) {
	for src, lim := range l {
		if lim.Tokens() >= float64(perMinute) {
			delete(l, src)
		}
	}
	for src := range l {
		if len(l) < maxTrackedSources*3/4 {
			break
		}
		delete(l, src)
	}
}

// Budgets of log lines that strangers can cause.
const (
	logLinesPerSource = 5  // a minute, with a burst as large
	logLinesPerMinute = 60 // from every source together, with a burst as large
)

// LogBudget bounds the log lines that agents cause, so that a stranger
// cannot choose how much the operator reads: logLinesPerSource a minute
// for one source address (an IPv6 /64), logLinesPerMinute for all of them
// together. Its zero value is ready to use.
type LogBudget struct {
	mu      sync.Mutex
	sources sourceLimiters
	all     *rate.Limiter
}

// Allow reports whether a line about src fits in the budget, and spends
// it.
func (b *LogBudget) Allow(src netip.Prefix) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.all == nil {
		b.all = rate.NewLimiter(rate.Limit(float64(logLinesPerMinute)/60), logLinesPerMinute)
	}
	// The budget of all sources is spent only by a line its source may have.
	lim := b.sources.get(src, logLinesPerSource)
	return lim.Tokens() >= 1 && b.all.Allow() && lim.Allow()
}
