package edge

import (
	"container/heap"
	"container/list"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
	"golang.org/x/time/rate"
)

// The edge's defences against strangers: a bound on agent connections that
// have not said hello, a throttle on failed authentication per source, a
// fair share of each endpoint per public client, and quotas of endpoints.

// Bounds of the tables the limits keep.
const (
	authLogWindow     = 10 * time.Second
	maxTrackedSources = 1 << 16
)

// addPending registers an agent conn that has not said hello yet. When
// its source has PendingSessionsPerSource waiting already, the source's
// own oldest is closed; when PendingSessions are waiting, the oldest of
// the source that has the most: a flood of silent connections pushes out
// its own, while a real agent elsewhere, which says hello within a few
// round trips however far away it is, gets through.
func (s *Server) addPending(c net.Conn) *pendingConn {
	src := sourceOf(addrPort(c.RemoteAddr()).Addr())
	s.mu.Lock()
	defer s.mu.Unlock()
	pc := s.pending.add(c, src, s.cfg.pendingSessions > 0)
	var victim *pendingConn
	var why string
	switch perSource, max := s.cfg.pendingPerSource, s.cfg.pendingSessions; {
	case perSource > 0 && src.IsValid() && pc.from.conns.Len() > perSource:
		victim, why = pc.from.oldest(), "too many agent connections of one source waiting for their hello; closing its oldest"
	case max > 0 && s.pending.total > max:
		victim, why = s.pending.most().oldest(), "too many agent connections waiting for their hello; closing the oldest of the source that has the most"
	default:
		return pc
	}
	from := victim.from.src
	s.pending.remove(victim)
	s.evicted++
	s.obs().Refused(ReasonPendingLimit) // before the close: whoever sees the close sees the count
	victim.conn.Close()
	if s.evicted == 1 || s.evicted%1000 == 0 {
		s.log().Warn(why, "source", from.String(), "max", s.cfg.pendingSessions, "max_per_source", s.cfg.pendingPerSource, "closed_so_far", s.evicted)
	}
	return pc
}

// donePending forgets a conn once it said hello or ended. Removing it twice
// is harmless.
func (s *Server) donePending(pc *pendingConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending.remove(pc)
}

// pendingConns are the agent conns waiting for their hello, by source
// (see sourceOf; the conns that are not over IP, from a pipe or a Unix
// socket, are one source, of the invalid prefix), for the bounds
// Limits.PendingSessions and PendingSessionsPerSource. It finds the
// source that has the most at once, however many there are. Its zero
// value is ready to use; the Server's mu guards it.
type pendingConns struct {
	total   int
	sources map[netip.Prefix]*pendingSource
	// ranks[n] are the sources that have n conns, in the order they came
	// to have n; kept only when ranked (when Limits.PendingSessions
	// bounds them all, so that it has no more than that bound, and one).
	// top is the highest n with a source.
	ranks []*list.List
	top   int
}

// pendingSource is the conns of one source waiting for their hello.
type pendingSource struct {
	src   netip.Prefix
	conns list.List     // of *pendingConn, oldest first
	rank  *list.Element // in ranks[conns.Len()]; nil when not ranked
}

// pendingConn is an agent conn waiting for its hello.
type pendingConn struct {
	conn net.Conn
	from *pendingSource // nil once removed
	elem *list.Element  // in from.conns
}

// oldest returns the conn of ps that waits the longest.
func (ps *pendingSource) oldest() *pendingConn {
	return ps.conns.Front().Value.(*pendingConn)
}

// add counts c, from src, and ranks its source if ranked.
func (p *pendingConns) add(c net.Conn, src netip.Prefix, ranked bool) *pendingConn {
	ps := p.sources[src]
	if ps == nil {
		if p.sources == nil {
			p.sources = map[netip.Prefix]*pendingSource{}
		}
		ps = &pendingSource{src: src}
		p.sources[src] = ps
	}
	pc := &pendingConn{conn: c, from: ps}
	pc.elem = ps.conns.PushBack(pc)
	p.total++
	if ranked {
		p.rerank(ps, ps.conns.Len()-1)
	}
	return pc
}

// remove forgets pc; removing it again does nothing.
func (p *pendingConns) remove(pc *pendingConn) {
	ps := pc.from
	if ps == nil {
		return
	}
	pc.from = nil
	ps.conns.Remove(pc.elem)
	p.total--
	if ps.rank != nil {
		p.rerank(ps, ps.conns.Len()+1)
	}
	if ps.conns.Len() == 0 {
		delete(p.sources, ps.src)
	}
}

// rerank moves ps from the rank of the was conns it had to the rank of
// those it has now.
func (p *pendingConns) rerank(ps *pendingSource, was int) {
	if ps.rank != nil {
		p.ranks[was].Remove(ps.rank)
		ps.rank = nil
	}
	n := ps.conns.Len()
	if n > 0 {
		for len(p.ranks) <= n {
			p.ranks = append(p.ranks, list.New())
		}
		ps.rank = p.ranks[n].PushBack(ps)
		p.top = max(p.top, n)
	}
	for p.top > 0 && p.ranks[p.top].Len() == 0 {
		p.top--
	}
}

// most returns the ranked source that has the most conns (of several,
// the first to have that many), or nil when none is ranked.
func (p *pendingConns) most() *pendingSource {
	if p.top == 0 {
		return nil
	}
	return p.ranks[p.top].Front().Value.(*pendingSource)
}

// all yields every conn waiting for its hello.
func (p *pendingConns) all(yield func(net.Conn) bool) {
	for _, ps := range p.sources {
		for e := ps.conns.Front(); e != nil; e = e.Next() {
			if !yield(e.Value.(*pendingConn).conn) {
				return
			}
		}
	}
}

// sourceOf returns the key failed authentications are counted by: the
// address for IPv4, its /64 for IPv6 (one host's share of a network).
func sourceOf(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// authGuard throttles failed hellos per source, and logs them: each at
// once, with the agent's address, within a budget per source (see
// logBudget), and the rest in aggregate every authLogWindow.
type authGuard struct {
	perMinute int // failures a source may have per minute, with a burst as large; 0: no throttle
	log       *slog.Logger
	lines     logBudget

	mu      sync.Mutex
	sources sourceLimiters
	// what the next aggregate log line reports
	unlogged, refused int
	seen              map[netip.Prefix]struct{}
	timer             *time.Timer
}

// blocked reports whether a source spent its failures: its agent
// connections are closed at once.
func (g *authGuard) blocked(src netip.Prefix) bool {
	if g == nil || g.perMinute == 0 || !src.IsValid() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	lim := g.sources[src]
	if lim == nil || lim.Tokens() >= 1 {
		return false
	}
	g.refused++
	g.noteLocked(src)
	return true
}

// failed counts a failed hello from the agent at addr, refused with err,
// and logs it.
func (g *authGuard) failed(addr net.Addr, err error) {
	if g == nil {
		return
	}
	src := sourceOf(addrPort(addr).Addr())
	if g.lines.allow(src) {
		g.log.Warn("agent refused: authentication failed", "agent_addr", addr.String(), "err", err)
	} else {
		g.mu.Lock()
		g.unlogged++
		g.noteLocked(src)
		g.mu.Unlock()
	}
	if g.perMinute == 0 || !src.IsValid() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sources.get(src, g.perMinute).Allow()
}

// noteLocked counts src for the next aggregate line, which it schedules.
func (g *authGuard) noteLocked(src netip.Prefix) {
	if g.seen == nil {
		g.seen = map[netip.Prefix]struct{}{}
	}
	if len(g.seen) < maxTrackedSources {
		g.seen[src] = struct{}{}
	}
	if g.timer == nil {
		g.timer = time.AfterFunc(authLogWindow, g.flush)
	}
}

// flush logs, in one line, what was not logged one by one since the last.
func (g *authGuard) flush() {
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
		g.log.Warn("failed agent authentications, not logged one by one", "failures", unlogged, "closed_at_accept", refused, "sources", sources)
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

// logBudget bounds the log lines that agents cause, so that a stranger
// cannot choose how much the operator reads: logLinesPerSource a minute
// for one source address (an IPv6 /64), logLinesPerMinute for all of them
// together. Its zero value is ready to use.
type logBudget struct {
	mu      sync.Mutex
	sources sourceLimiters
	all     *rate.Limiter
}

// allow reports whether a line about src fits in the budget, and spends
// it.
func (b *logBudget) allow(src netip.Prefix) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.all == nil {
		b.all = rate.NewLimiter(rate.Limit(float64(logLinesPerMinute)/60), logLinesPerMinute)
	}
	// The budget of all sources is spent only by a line its source may have.
	lim := b.sources.get(src, logLinesPerSource)
	return lim.Tokens() >= 1 && b.all.Allow() && lim.Allow()
}

// shares counts, per endpoint and client source, the streams in use: a
// public client may hold only its share of an endpoint.
type shares struct {
	mu sync.Mutex
	n  map[shareKey]int
}

// endpointKey is an endpoint: a protocol and a name pattern.
type endpointKey struct{ proto, name string }

type shareKey struct {
	endpoint endpointKey
	client   netip.Prefix
}

// clientCap returns how many streams of the endpoint of routes one client
// may hold: ClientShare of the streams of its sessions; zero for no bound.
func (s *Server) clientCap(routes []router.Route) int {
	share, perSession := s.cfg.clientShare, s.cfg.streamsPerSession
	if share == 0 || perSession == 0 {
		return 0
	}
	sessions := map[string]struct{}{}
	for _, r := range routes {
		sessions[r.Edge+"/"+r.SessionID] = struct{}{}
	}
	return max(1, int(share*float64(len(sessions)*perSession)))
}

// acquireShare takes one of client's share of the endpoint of routes, or
// reports false when the client holds all of it. release gives it back.
func (s *Server) acquireShare(routes []router.Route, client netip.AddrPort) (release func(), ok bool) {
	limit := s.clientCap(routes)
	if limit == 0 || len(routes) == 0 {
		return func() {}, true
	}
	k := shareKey{endpointKey{routes[0].Proto, routes[0].Name}, sourceOf(client.Addr())}
	sh := &s.shares
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.n[k] >= limit {
		return nil, false
	}
	if sh.n == nil {
		sh.n = map[shareKey]int{}
	}
	sh.n[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			if sh.n[k]--; sh.n[k] <= 0 {
				delete(sh.n, k)
			}
		})
	}, true
}

// endpointCounts counts the endpoints held on the edge, the binds under
// way, and the names kept for the identities of sessions that ended (see
// keepEndpoint), for the quotas of Limits: by identity, by source address
// of anonymous agents, and in all.
type endpointCounts struct {
	mu          sync.Mutex
	perIdentity map[string]int
	perSource   map[netip.Prefix]int
	total       int
	// kept are the names kept for their owners, each counted until it
	// lapses or its identity binds it again; lapses has when each
	// lapses, the soonest first, with stale entries (a name taken back,
	// or kept anew) among them.
	kept   map[endpointKey]keptName
	lapses lapseHeap
}

// endpointOwner is whom an endpoint counts against: its identity, and for
// an anonymous agent its source (an invalid prefix otherwise).
type endpointOwner struct {
	identity string
	source   netip.Prefix
}

// keptName is a name the Router keeps for its owner's identity until a
// time: after the session that held it ended, or after a restart.
type keptName struct {
	owner endpointOwner
	until time.Time
}

// quotaRefusal is a bind refused for a bound on endpoints: the reason, and
// what the agent is told.
type quotaRefusal struct {
	reason  Reason
	message string
}

// takeEndpoint counts one more endpoint of o, unless that breaks a quota,
// which it then returns. A bind of name (the zero key when the edge
// chooses the name), when name is kept for o's identity, takes its place:
// the name counts once, and what kept it is returned, for doneBinding to
// keep it again should the bind fail. giveEndpoints uncounts endpoints.
func (s *Server) takeEndpoint(o endpointOwner, name endpointKey) (*keptName, *quotaRefusal) {
	c := &s.endpointCounts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lapseLocked(s.now())
	var took *keptName
	if k, ok := c.kept[name]; ok && k.owner.identity == o.identity {
		delete(c.kept, name)
		c.uncountLocked(k.owner, 1)
		took = &k
	}
	if refused := s.quotaLocked(o); refused != nil {
		if took != nil {
			c.kept[name] = *took // its lapse is still ahead, in lapses
			c.countLocked(took.owner)
		}
		return nil, refused
	}
	c.countLocked(o)
	return took, nil
}

// quotaLocked returns the quota one more endpoint of o would break, if
// any.
func (s *Server) quotaLocked(o endpointOwner) *quotaRefusal {
	c := &s.endpointCounts
	if max := s.cfg.endpoints; max > 0 && c.total >= max {
		return &quotaRefusal{ReasonEdgeEndpointLimit, fmt.Sprintf("this edge holds as many endpoints as it takes (%d, every agent's together); try again later", max)}
	}
	if max := s.cfg.endpointsPerID; max > 0 && c.perIdentity[o.identity] >= max {
		return &quotaRefusal{ReasonIdentityEndpointLimit, fmt.Sprintf("too many endpoints for this identity on this edge (at most %d, over all its sessions)", max)}
	}
	if max := s.cfg.endpointsPerSource; max > 0 && o.source.IsValid() && c.perSource[o.source] >= max {
		return &quotaRefusal{ReasonSourceEndpointLimit, fmt.Sprintf("too many endpoints for anonymous agents from %s on this edge (at most %d)", o.source, max)}
	}
	return nil
}

// keepEndpoint ends the count of an endpoint of o whose session ended:
// when its name is kept for o's identity until then (a zero until: it
// is not), the name stays counted until then, or until o's identity binds
// it again (see takeEndpoint); otherwise it is uncounted at once. A name
// counts once, however many of its routes ended.
func (s *Server) keepEndpoint(o endpointOwner, name endpointKey, until time.Time) {
	c := &s.endpointCounts
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.now()
	c.lapseLocked(now)
	if !until.After(now) {
		c.uncountLocked(o, 1)
		return
	}
	if k, ok := c.kept[name]; ok {
		c.uncountLocked(o, 1) // counted already
		if k.owner.identity == o.identity && until.After(k.until) {
			k.until = until
			c.kept[name] = k
			heap.Push(&c.lapses, lapse{name, until})
		}
		return
	}
	if c.kept == nil {
		c.kept = map[endpointKey]keptName{}
	}
	c.kept[name] = keptName{o, until}
	heap.Push(&c.lapses, lapse{name, until})
}

// keepRestored counts the names that a restart keeps for the identities
// that held them when the edge stopped (see openRecord; held is what it
// restored) as kept for them (see keepEndpoint), until they lapse or are
// bound again. The record does not say where anonymous agents were: they
// count against no source.
func (s *Server) keepRestored(held map[endpointKey]holding) {
	c := &s.endpointCounts
	for name, h := range held {
		o := endpointOwner{identity: h.identity}
		c.mu.Lock()
		c.countLocked(o)
		c.mu.Unlock()
		s.keepEndpoint(o, name, h.until)
	}
}

// keepAgain counts again a name that a bind which failed took from those
// kept (takeEndpoint), unless it lapsed meanwhile or is kept anew.
func (s *Server) keepAgain(name endpointKey, k keptName) {
	c := &s.endpointCounts
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.now()
	c.lapseLocked(now)
	if _, ok := c.kept[name]; ok || !k.until.After(now) {
		return
	}
	c.kept[name] = k // its lapse is still ahead, in lapses
	c.countLocked(k.owner)
}

// giveEndpoints uncounts n endpoints of o.
func (s *Server) giveEndpoints(o endpointOwner, n int) {
	if n == 0 {
		return
	}
	c := &s.endpointCounts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.uncountLocked(o, n)
}

func (c *endpointCounts) countLocked(o endpointOwner) {
	if c.perIdentity == nil {
		c.perIdentity = map[string]int{}
		c.perSource = map[netip.Prefix]int{}
	}
	c.total++
	c.perIdentity[o.identity]++
	if o.source.IsValid() {
		c.perSource[o.source]++
	}
}

func (c *endpointCounts) uncountLocked(o endpointOwner, n int) {
	c.total -= n
	if c.perIdentity[o.identity] -= n; c.perIdentity[o.identity] <= 0 {
		delete(c.perIdentity, o.identity)
	}
	if o.source.IsValid() {
		if c.perSource[o.source] -= n; c.perSource[o.source] <= 0 {
			delete(c.perSource, o.source)
		}
	}
}

// lapseLocked uncounts the kept names whose time is up.
func (c *endpointCounts) lapseLocked(now time.Time) {
	for len(c.lapses) > 0 && !c.lapses[0].until.After(now) {
		l := heap.Pop(&c.lapses).(lapse)
		if k, ok := c.kept[l.name]; ok && k.until.Equal(l.until) {
			delete(c.kept, l.name)
			c.uncountLocked(k.owner, 1)
		}
	}
}

// lapse is when a kept name lapses, unless it was taken back or kept
// anew (until is then not its own) meanwhile.
type lapse struct {
	name  endpointKey
	until time.Time
}

// lapseHeap is lapses, the soonest first (container/heap).
type lapseHeap []lapse

func (h lapseHeap) Len() int           { return len(h) }
func (h lapseHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h lapseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lapseHeap) Push(x any)        { *h = append(*h, x.(lapse)) }
func (h *lapseHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
