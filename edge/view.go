package edge

import (
	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// The control plane's view of the edge, and its lever (package view):
// Sessions, Endpoints, Watch and Disconnect.

// Sessions returns the agent sessions this edge holds whose hello was
// accepted, ordered by when that was (then by ID), each with its
// endpoints and their traffic. It is a snapshot taken while the edge
// serves: each session is read under its own lock, consistent within
// itself, while the others go on; no public request or connection waits
// for it.
func (s *Server) Sessions() []view.Session {
	s.init()
	var out []view.Session
	for _, ss := range s.sessionList() {
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
// for identity for Timeouts.Grace, as for any session that ends (its
// agent, connecting again, gets them back), or, with free, freed at once
// (but for the operator's reservations, see Reserve). It does not keep
// identity from connecting again: withdraw its token first, so that
// Authenticate refuses it (a hello accepted before that, and not seen by
// Disconnect yet, still opens a session). In a cluster, call it on every
// edge.
func (s *Server) Disconnect(identity string, free bool) int {
	s.init()
	reserve, n := s.cfg.grace, 0
	if free {
		reserve = 0
	}
	for _, ss := range s.sessionList() {
		ss.mu.Lock()
		mine := ss.hello == helloAccepted && !ss.closed && ss.identity == identity
		ss.mu.Unlock()
		if mine {
			ss.close(reserve)
			n++
		}
	}
	return n
}

// Watch calls f with each event on this edge from now on (see
// view.EventKind): sessions up and down, binds, unbinds, refused hellos
// and binds, and a drain. To start from a known state, call Watch, then
// Sessions (an event may then tell of a change the snapshot shows).
//
// f is called from a goroutine of the watch's own, one event at a time,
// in the order the edge made the changes (a session's SessionUp before
// its binds, a bind before its unbind, its SessionDown last), so that a
// slow f delays nothing but its own events, which wait in a queue of up to
// 65536. Past that, events are dropped, and f hears how many with a Lost
// event before the next one: call Sessions to catch up. f may call the
// Server's methods, but not stop. stop ends the watch and waits for a
// call of f under way; calling it again does nothing. Close and Shutdown
// end every watch once f had the events of the sessions they closed.
//
// Events are a hook of their own rather than methods of Observer, which
// counts, on the request path, with no identity or name (so that metrics
// keep a bounded set of labels), and must not block: events name who and
// what, come only from the agents' side (no public request makes one),
// and may be handled as slowly as a control plane likes.
func (s *Server) Watch(f func(view.Event)) (stop func()) {
	s.init()
	return s.events.Watch(f, func(n int) { f(view.Event{Kind: view.Lost, Time: s.now(), Lost: n}) })
}

// note tells the watchers of an event of kind on the session, about the
// endpoint e when not nil.
func (ss *session) note(kind view.EventKind, e *book.Endpoint) {
	if !ss.srv.events.Watched() {
		return
	}
	ev := view.Event{Kind: kind, Time: ss.srv.now(), Session: ss.id, Identity: ss.identity, Remote: ss.src.String()}
	if e != nil {
		ev.Proto, ev.Name, ev.URL = e.Route.Proto, e.Route.Name, e.URL
	}
	ss.srv.events.Publish(ev)
}

// refused tells the watchers of a hello or bind (asking for r's Proto and
// Name) refused with err, by identity when known.
func (ss *session) refused(identity string, r *router.Route, err *wire.Error) {
	if !ss.srv.events.Watched() {
		return
	}
	ev := view.Event{Kind: view.Refused, Time: ss.srv.now(), Session: ss.id, Identity: identity, Remote: ss.src.String(), Reason: err.Code, Message: err.Message}
	if r != nil {
		ev.Proto, ev.Name = r.Proto, r.Name
	}
	ss.srv.events.Publish(ev)
}
