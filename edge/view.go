package edge

import (
	"slices"
	"strings"
	"sync"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/view"
)

// The control plane's view of the edge, and its lever (package view).

// Sessions returns the agent sessions this edge holds whose hello was
// accepted, ordered by ID, each with its endpoints and their traffic: a
// snapshot taken while the edge serves, each session read under its own
// lock; no public request or connection waits for it.
func (s *Server) Sessions() []view.Session {
	list := s.sessionList()
	slices.SortFunc(list, func(a, b *session) int { return strings.Compare(a.id, b.id) })
	out := make([]view.Session, 0, len(list))
	for _, ss := range list {
		ss.mu.Lock()
		if ss.hello == helloAccepted && !ss.closed {
			v := view.Session{ID: ss.id, Identity: ss.identity, Remote: ss.src.String(), Version: ss.version, Agent: ss.agent, Since: ss.since}
			for _, e := range ss.routes.All() {
				v.Endpoints = append(v.Endpoints, e.View())
			}
			out = append(out, v)
		}
		ss.mu.Unlock()
	}
	book.Finish(out)
	return out
}

// Endpoints returns the endpoints bound on this edge's sessions, ordered
// by URL (then by session), taken as Sessions takes them.
func (s *Server) Endpoints() []view.Endpoint { return book.Endpoints(s.Sessions()) }

// Disconnect closes every session of identity on this edge now, as if its
// agent had gone, and returns how many it closed. Their names are kept
// for identity for Timeouts.Grace, as for any session that ends, or, with
// free, freed at once (but for the operator's reservations, see Reserve).
// It does not keep identity from connecting again: withdraw its token
// first, so that Authenticate refuses it (a hello accepted before that,
// and not seen by Disconnect yet, still opens a session). An anonymous
// identity (Authenticate nil), which its agents prove with their session
// tickets alone, is kept out by free, connected or not: its tickets are
// revoked first, for Timeouts.SessionTicketLifetime (in the record of
// StateDir, or in a Router that is a router.Revoker, so on every edge of a
// cluster), so that an agent showing one, the disconnected agent or a
// copy of its state, is a new identity, with none of the names kept for
// the old one. In a cluster, call it on every edge.
func (s *Server) Disconnect(identity string, free bool) int {
	s.init()
	reserve, n := s.cfg().grace, 0
	if free {
		reserve = 0
		if s.Authenticate == nil && strings.HasPrefix(identity, anonymousPrefix) {
			s.revoke(identity)
		}
	}
	why := "disconnected by the edge's operator; its names are kept for it a while"
	if free {
		why = "disconnected by the edge's operator; its names are free"
	}
	var closing sync.WaitGroup
	for _, ss := range s.sessionList() {
		ss.mu.Lock()
		mine := ss.hello == helloAccepted && !ss.closed && ss.identity == identity
		ss.mu.Unlock()
		if mine {
			// The agent hears why before its session ends (a second at
			// most), rather than see its connection closed.
			closing.Go(func() {
				ss.farewell(why)
				ss.close(reserve)
			})
			n++
		}
	}
	closing.Wait()
	return n
}

// Watch calls f with each event on this edge from now on, from a
// goroutine of the watch's own, in order, until stop (which waits for a
// call of f under way: f must not call it, nor Close or Shutdown), or
// until Close or Shutdown, once f had the events of the sessions they
// closed. A slow f delays only its own events, which wait in a queue of up
// to 65536, then are dropped, with an event of kind view.Lost (see package
// view). Events are a hook of their own rather than methods of Observer,
// which counts on the request path, with no identity or name (metrics
// keep a bounded set of labels), and must not block.
func (s *Server) Watch(f func(view.Event)) (stop func()) {
	s.init()
	return s.events.Watch(f, func(n int) { f(view.Event{Kind: view.Lost, Time: s.now(), Lost: n}) })
}
