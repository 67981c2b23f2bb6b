// Package book keeps what an edge shows a control plane of itself
// (package edge/view): the counters of each endpoint bound on its
// sessions, bumped on the data path with one atomic add each (Endpoint),
// the order and the pools of a snapshot (Finish), and the events its
// watchers get, each watcher in order from a goroutine of its own (Hub).
package book

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Endpoint is an endpoint bound on a session: its route, what a snapshot
// shows of it, and its traffic. Its methods may be called on a nil
// *Endpoint (a stream whose endpoint went as it was opened), and then do
// nothing.
type Endpoint struct {
	Route   router.Route
	URL     string   // its public URL
	Kinds   []string // of the traffic policy enforced on it; never modified
	Checked bool     // its agent checks its app, and reports it up or down (SetUp)

	requests, conns, in, out atomic.Int64
	up                       atomic.Bool  // the last report said up
	reported                 atomic.Bool  // a report came
	retryAfter               atomic.Int32 // seconds, from the report; zero: none said
}

// Down reports whether the endpoint is not to be routed to: its agent
// checks its app, which is down, or not reported up yet.
func (e *Endpoint) Down() bool {
	return e != nil && e.Checked && !e.up.Load()
}

// SetUp records the agent's report: its app is up, or down; retryAfter
// is when it may be up again at the soonest, in seconds.
func (e *Endpoint) SetUp(up bool, retryAfter int) {
	e.retryAfter.Store(int32(min(max(retryAfter, 0), 1<<30)))
	e.up.Store(up)
	e.reported.Store(true)
}

// RetryAfter returns, for a down endpoint, the seconds its agent said it
// takes at least to be seen up again; zero: not said.
func (e *Endpoint) RetryAfter() int {
	if e == nil {
		return 0
	}
	return int(e.retryAfter.Load())
}

// Health returns what View shows of its health.
func (e *Endpoint) Health() string {
	switch {
	case e == nil || !e.Checked:
		return ""
	case e.up.Load():
		return view.HealthUp
	case e.reported.Load():
		return view.HealthDown
	}
	return view.HealthPending
}

// Request counts a request, or a connection, sent to the endpoint's agent.
func (e *Endpoint) Request() {
	if e != nil {
		e.requests.Add(1)
	}
}

// Opened counts a stream of proto to the agent opened, and Closed one
// closed. A tls or tcp stream is a connection: a request too (an http
// one's requests are counted by the exchange, with Request).
func (e *Endpoint) Opened(proto string) {
	if e != nil {
		e.conns.Add(1)
		if proto == wire.ProtoTLS || proto == wire.ProtoTCP {
			e.requests.Add(1)
		}
	}
}

// Closed: see Opened.
func (e *Endpoint) Closed() {
	if e != nil {
		e.conns.Add(-1)
	}
}

// Sent counts n bytes sent to the agent, and Received n bytes from it.
func (e *Endpoint) Sent(n int) {
	if e != nil && n > 0 {
		e.in.Add(int64(n))
	}
}

// Received: see Sent.
func (e *Endpoint) Received(n int) {
	if e != nil && n > 0 {
		e.out.Add(int64(n))
	}
}

// Follow makes e, which takes old's place (the same name, changed in
// place), go on from old's counts of requests and bytes. old's conns
// still open are counted by old.
func (e *Endpoint) Follow(old *Endpoint) {
	e.requests.Add(old.requests.Load())
	e.in.Add(old.in.Load())
	e.out.Add(old.out.Load())
	if e.Checked && old.Checked && old.reported.Load() {
		e.SetUp(old.up.Load(), old.RetryAfter()) // until the agent says otherwise
	}
}

// View returns what a snapshot shows of the endpoint: its Pool is 1, or,
// for a route that asked for a pool, 0 until Finish counts it.
func (e *Endpoint) View() view.Endpoint {
	r := e.Route
	v := view.Endpoint{
		URL: e.URL, Proto: r.Proto, Name: r.Name, Identity: r.Identity, Session: r.SessionID, Tunnel: r.TunnelID,
		Policy:   slices.Clone(e.Kinds),
		Requests: e.requests.Load(), Conns: e.conns.Load(), BytesIn: e.in.Load(), BytesOut: e.out.Load(),
		Health: e.Health(),
	}
	if !r.Pool {
		v.Pool = 1
	}
	return v
}

// Event returns an event of kind about the endpoint: its Proto, Name and
// URL.
func (e *Endpoint) Event(kind view.EventKind) view.Event {
	return view.Event{Kind: kind, Proto: e.Route.Proto, Name: e.Route.Name, URL: e.URL}
}

// Finish orders the endpoints of each session of a snapshot by URL, and
// sets the Pool of each that View left at 0 (its route asked for a
// pool): how many of them all share its Proto and Name.
func Finish(sessions []view.Session) {
	type key struct{ proto, name string }
	var pools map[key]int
	for _, s := range sessions {
		for _, e := range s.Endpoints {
			if e.Pool == 0 {
				if pools == nil {
					pools = map[key]int{}
				}
				pools[key{e.Proto, e.Name}]++
			}
		}
	}
	for _, s := range sessions {
		for i := range s.Endpoints {
			if e := &s.Endpoints[i]; e.Pool == 0 {
				e.Pool = pools[key{e.Proto, e.Name}]
			}
		}
		slices.SortFunc(s.Endpoints, func(a, b view.Endpoint) int { return cmp.Compare(a.URL, b.URL) })
	}
}

// Endpoints returns the endpoints of the sessions of a snapshot that
// Finish finished, ordered by URL, then session.
func Endpoints(sessions []view.Session) []view.Endpoint {
	n := 0
	for _, s := range sessions {
		n += len(s.Endpoints)
	}
	out := make([]view.Endpoint, 0, n)
	for _, s := range sessions {
		out = append(out, s.Endpoints...)
	}
	sortLarge(out, func(a, b *view.Endpoint) int {
		return cmp.Or(cmp.Compare(a.URL, b.URL), cmp.Compare(a.Session, b.Session))
	})
	return out
}

// sortLarge sorts s by cmp, as slices.SortFunc would, but sorts indexes,
// then moves each element once: a sort of large structs moves them
// O(n log n) times.
func sortLarge[T any](s []T, cmp func(a, b *T) int) {
	idx := make([]int32, len(s))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int { return cmp(&s[a], &s[b]) })
	// s[j] is to be the element now at idx[j]: follow each cycle of the
	// permutation, marking the places done.
	for i := range idx {
		if int(idx[i]) == i {
			continue
		}
		first, j := s[i], i
		for {
			k := int(idx[j])
			idx[j] = int32(j)
			if k == i {
				s[j] = first
				break
			}
			s[j] = s[k]
			j = k
		}
	}
}
