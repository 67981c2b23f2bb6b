package limits

import (
	"container/heap"
	"net/netip"
	"sync"
	"time"
)

// Quotas counts the endpoints held on an edge (names of type E), the
// binds under way, and the names kept for the identities of sessions that
// ended (see Keep), against three bounds: by identity, by source address
// of anonymous agents, and in all. Its zero value has no bounds; set them
// before the first Take.
type Quotas[E comparable] struct {
	// Edge, PerIdentity and PerSource bound the endpoints of the edge,
	// of one identity and of one source of anonymous agents. Zero: no
	// bound.
	Edge, PerIdentity, PerSource int

	mu          sync.Mutex
	perIdentity map[string]int
	perSource   map[netip.Prefix]int
	total       int
	// kept are the names kept for their owners, each counted until it
	// lapses or its identity binds it again; lapses has when each
	// lapses, the soonest first, with stale entries (a name taken back,
	// or kept anew) among them.
	kept   map[E]Kept
	lapses lapseHeap[E]
}

// SetBounds changes Edge, PerIdentity and PerSource, which the next Take
// holds to: endpoints counted already stay, above a lowered bound too.
func (q *Quotas[E]) SetBounds(edge, perIdentity, perSource int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.Edge, q.PerIdentity, q.PerSource = edge, perIdentity, perSource
}

// Owner is whom an endpoint counts against: its identity, and for an
// anonymous agent its source (the invalid prefix otherwise).
type Owner struct {
	Identity string
	Source   netip.Prefix
}

// Kept is a name kept for its owner's identity until a time: after the
// session that held it ended, or after a restart.
type Kept struct {
	Owner Owner
	Until time.Time
}

// Quota is a bound of Quotas.
type Quota int

const (
	QuotaNone     Quota = iota // no bound is broken
	QuotaEdge                  // Quotas.Edge
	QuotaIdentity              // Quotas.PerIdentity
	QuotaSource                // Quotas.PerSource
)

// Take counts one more endpoint of o at now, unless that breaks a quota,
// which it then returns (with its bound). A bind of name (the zero E
// when the edge chooses the name), when name is kept for o's identity,
// takes its place: the name counts once, and what kept it is returned,
// for KeepAgain should the bind fail. Give uncounts endpoints.
func (q *Quotas[E]) Take(o Owner, name E, now time.Time) (took *Kept, broken Quota, max int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lapseLocked(now)
	if k, ok := q.kept[name]; ok && k.Owner.Identity == o.Identity {
		delete(q.kept, name)
		q.uncountLocked(k.Owner, 1)
		took = &k
	}
	if broken, max := q.quotaLocked(o); broken != QuotaNone {
		if took != nil {
			q.kept[name] = *took // its lapse is still ahead, in lapses
			q.countLocked(took.Owner)
		}
		return nil, broken, max
	}
	q.countLocked(o)
	return took, QuotaNone, 0
}

// quotaLocked returns the quota one more endpoint of o would break, if
// any, and its bound.
func (q *Quotas[E]) quotaLocked(o Owner) (Quota, int) {
	switch {
	case q.Edge > 0 && q.total >= q.Edge:
		return QuotaEdge, q.Edge
	case q.PerIdentity > 0 && q.perIdentity[o.Identity] >= q.PerIdentity:
		return QuotaIdentity, q.PerIdentity
	case q.PerSource > 0 && o.Source.IsValid() && q.perSource[o.Source] >= q.PerSource:
		return QuotaSource, q.PerSource
	}
	return QuotaNone, 0
}

// Keep ends the count of an endpoint of o whose session ended: when its
// name is kept for o's identity until then (an until not after now: it is
// not), the name stays counted until then, or until o's identity binds
// it again (see Take); otherwise it is uncounted at once. A name counts
// once, however many of its routes ended.
func (q *Quotas[E]) Keep(o Owner, name E, until, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lapseLocked(now)
	if !until.After(now) {
		q.uncountLocked(o, 1)
		return
	}
	if k, ok := q.kept[name]; ok {
		q.uncountLocked(o, 1) // counted already
		if k.Owner.Identity == o.Identity && until.After(k.Until) {
			k.Until = until
			q.kept[name] = k
			heap.Push(&q.lapses, lapse[E]{name, until})
		}
		return
	}
	if q.kept == nil {
		q.kept = map[E]Kept{}
	}
	q.kept[name] = Kept{o, until}
	heap.Push(&q.lapses, lapse[E]{name, until})
}

// KeepRestored counts name, which a restart keeps for o's identity until
// until, as kept (see Keep), until it lapses or is bound again.
func (q *Quotas[E]) KeepRestored(o Owner, name E, until, now time.Time) {
	q.mu.Lock()
	q.countLocked(o)
	q.mu.Unlock()
	q.Keep(o, name, until, now)
}

// KeepAgain counts again a name that a bind which failed took from those
// kept (Take), unless it lapsed meanwhile or is kept anew.
func (q *Quotas[E]) KeepAgain(name E, k Kept, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lapseLocked(now)
	if _, ok := q.kept[name]; ok || !k.Until.After(now) {
		return
	}
	q.kept[name] = k // its lapse is still ahead, in lapses
	q.countLocked(k.Owner)
}

// Give uncounts n endpoints of o.
func (q *Quotas[E]) Give(o Owner, n int) {
	if n == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.uncountLocked(o, n)
}

// Counts returns the endpoints counted in all (names kept among them),
// those of one source, and the names kept, at now.
func (q *Quotas[E]) Counts(source netip.Prefix, now time.Time) (total, fromSource, kept int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lapseLocked(now)
	return q.total, q.perSource[source], len(q.kept)
}

// IsKept reports whether name is kept for an identity at now.
func (q *Quotas[E]) IsKept(name E, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lapseLocked(now)
	_, ok := q.kept[name]
	return ok
}

func (q *Quotas[E]) countLocked(o Owner) {
	if q.perIdentity == nil {
		q.perIdentity = map[string]int{}
		q.perSource = map[netip.Prefix]int{}
	}
	q.total++
	q.perIdentity[o.Identity]++
	if o.Source.IsValid() {
		q.perSource[o.Source]++
	}
}

func (q *Quotas[E]) uncountLocked(o Owner, n int) {
	q.total -= n
	if q.perIdentity[o.Identity] -= n; q.perIdentity[o.Identity] <= 0 {
		delete(q.perIdentity, o.Identity)
	}
	if o.Source.IsValid() {
		if q.perSource[o.Source] -= n; q.perSource[o.Source] <= 0 {
			delete(q.perSource, o.Source)
		}
	}
}

// lapseLocked uncounts the kept names whose time is up.
func (q *Quotas[E]) lapseLocked(now time.Time) {
	for len(q.lapses) > 0 && !q.lapses[0].until.After(now) {
		l := heap.Pop(&q.lapses).(lapse[E])
		if k, ok := q.kept[l.name]; ok && k.Until.Equal(l.until) {
			delete(q.kept, l.name)
			q.uncountLocked(k.Owner, 1)
		}
	}
}

// lapse is when a kept name lapses, unless it was taken back or kept
// anew (until is then not its own) meanwhile.
type lapse[E comparable] struct {
	name  E
	until time.Time
}

// lapseHeap is lapses, the soonest first (container/heap).
type lapseHeap[E comparable] []lapse[E]

func (h lapseHeap[E]) Len() int           { return len(h) }
func (h lapseHeap[E]) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h lapseHeap[E]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lapseHeap[E]) Push(x any)        { *h = append(*h, x.(lapse[E])) }
func (h *lapseHeap[E]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
