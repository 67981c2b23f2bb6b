package agent

import (
	"strconv"
	"time"
)

// EventKind says what happened to a client's session.
type EventKind int

// The kinds of events.
const (
	// Connected: a session is open (again); listeners are bound. After a
	// move to another edge (a draining edge asked it), the new session's.
	Connected EventKind = iota + 1
	// Disconnected: the session ended; Err says why.
	Disconnected
	// Reconnecting: an attempt starts after Delay: to open a session again
	// after one ended, or, within Listen, to open the first one or bind
	// an endpoint the edge could not grant yet. Err is why the previous
	// attempt failed, if one did. With several edges, Delay is the
	// backoff for the first attempt of a round and zero for the others.
	Reconnecting
	// TicketRenewed: the edge renewed the session's ticket while the
	// session goes on (edges of protocol version 5 and later), so that it
	// does not expire: Client.Ticket changed, and where it is kept (a
	// state file, for a later Client's ResumeTicket) it should be written
	// again, as after Connected.
	TicketRenewed
)

// String returns the kind's name: "connected", "disconnected",
// "reconnecting", "ticket_renewed".
func (k EventKind) String() string {
	switch k {
	case Connected:
		return "connected"
	case Disconnected:
		return "disconnected"
	case Reconnecting:
		return "reconnecting"
	case TicketRenewed:
		return "ticket_renewed"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is a change of a client's session state.
type Event struct {
	Kind    EventKind
	Err     error         // the cause, for Disconnected and failed attempts
	Attempt int           // for Reconnecting: 1 for the first attempt
	Delay   time.Duration // for Reconnecting: the wait before the attempt
	// Addr is the edge's address: the one connected to (Connected), the
	// one whose session ended (Disconnected), or the one the attempt will
	// try unless a session was opened meanwhile (Reconnecting).
	Addr string
}

func (c *Client) emit(e Event) {
	if c.OnEvent != nil {
		c.OnEvent(e)
	}
}

// Observer counts the public connections that reach a Client's
// listeners: package github.com/tunnelkit/tunnelkit/metrics turns them
// into Prometheus metrics. Its methods are called from many goroutines at
// once: they must be cheap and safe for concurrent use, and must not
// block. The session's events go to Client.OnEvent, not here.
type Observer interface {
	// Conn is called when a public connection reaches one of the client's
	// listeners, with its endpoint's protocol (http, https, tls, tcp).
	Conn(proto string)
	// Bytes is called when such a connection is closed, with the bytes
	// read from the client (in) and written to it (out).
	Bytes(proto string, in, out int64)
}
