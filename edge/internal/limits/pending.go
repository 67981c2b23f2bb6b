package limits

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
)

// Add counts c, an agent conn from src that has not said hello yet. When
// src has p.PerSource waiting already, the source's own oldest is
// evicted; when p.Max are waiting, the oldest of the source that has the
// most: a flood of silent connections pushes out its own, while a real
// agent elsewhere, which says hello within a few round trips however far
// away it is, gets through. Add returns c's place, for Done, and the conn
// evicted (closed by the caller), if any, with its source and which bound
// evicted it (perSource true: its source's).
func (p *Pending) Add(c net.Conn, src netip.Prefix) (pc *PendingConn, evicted net.Conn, from netip.Prefix, perSource bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc = p.add(c, src, p.Max > 0)
	var victim *PendingConn
	switch {
	case p.PerSource > 0 && src.IsValid() && pc.from.conns.Len() > p.PerSource:
		victim, perSource = pc.from.oldest(), true
	case p.Max > 0 && p.total > p.Max:
		victim = p.most().oldest()
	default:
		return pc, nil, netip.Prefix{}, false
	}
	from = victim.from.src
	p.remove(victim)
	return pc, victim.conn, from, perSource
}

// SetBounds changes Max and PerSource, which the next Add holds to.
func (p *Pending) SetBounds(max, perSource int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Max, p.PerSource = max, perSource
	if max > 0 {
		for _, ps := range p.sources {
			if ps.rank == nil {
				p.rerank(ps, 0) // counted while nothing bounded them all
			}
		}
	}
}

// Done forgets a conn once it said hello or ended. Forgetting it again,
// or one evicted, does nothing.
func (p *Pending) Done(pc *PendingConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.remove(pc)
}

// Len returns how many conns wait for their hello.
func (p *Pending) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total
}

// CloseAll closes every conn waiting for its hello.
func (p *Pending) CloseAll() {
	p.mu.Lock()
	var conns []net.Conn
	for c := range p.all {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Pending are the agent conns waiting for their hello, by source
// (see sourceOf; the conns that are not over IP, from a pipe or a Unix
// socket, are one source, of the invalid prefix), for the bounds
// Limits.PendingSessions and PendingSessionsPerSource. It finds the
// source that has the most at once, however many there are. Its zero
// value is ready to use.
type Pending struct {
	// Max bounds the conns waiting in all; PerSource those of one
	// source (not of the invalid prefix). Zero: no bound. Set them
	// before the first Add, and with SetBounds after.
	Max, PerSource int

	mu      sync.Mutex
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
	conns list.List     // of *PendingConn, oldest first
	rank  *list.Element // in ranks[conns.Len()]; nil when not ranked
}

// PendingConn is an agent conn waiting for its hello.
type PendingConn struct {
	conn net.Conn
	from *pendingSource // nil once removed
	elem *list.Element  // in from.conns
}

// oldest returns the conn of ps that waits the longest.
func (ps *pendingSource) oldest() *PendingConn {
	return ps.conns.Front().Value.(*PendingConn)
}

// add counts c, from src, and ranks its source if ranked.
func (p *Pending) add(c net.Conn, src netip.Prefix, ranked bool) *PendingConn {
	ps := p.sources[src]
	if ps == nil {
		if p.sources == nil {
			p.sources = map[netip.Prefix]*pendingSource{}
		}
		ps = &pendingSource{src: src}
		p.sources[src] = ps
	}
	pc := &PendingConn{conn: c, from: ps}
	pc.elem = ps.conns.PushBack(pc)
	p.total++
	if ranked {
		p.rerank(ps, ps.conns.Len()-1)
	}
	return pc
}

// remove forgets pc; removing it again does nothing.
func (p *Pending) remove(pc *PendingConn) {
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
func (p *Pending) rerank(ps *pendingSource, was int) {
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
func (p *Pending) most() *pendingSource {
	if p.top == 0 {
		return nil
	}
	return p.ranks[p.top].Front().Value.(*pendingSource)
}

// all yields every conn waiting for its hello.
func (p *Pending) all(yield func(net.Conn) bool) {
	for _, ps := range p.sources {
		for e := ps.conns.Front(); e != nil; e = e.Next() {
			if !yield(e.Value.(*PendingConn).conn) {
				return
			}
		}
	}
}
