// Package view is what an edge shows a control plane of itself: the agent
// sessions it holds and their endpoints, with their traffic
// (edge.Server's Sessions and Endpoints), and the events that change them
// (edge.Server's Watch). It is plain data, with JSON field names for an
// admin API, and builds without the edge, as package router does, so that
// a client of such an API can use it alone.
//
// # Events
//
// A watch (edge.Server.Watch) hears of sessions up and down, binds,
// unbinds, refused hellos and binds, and a drain, with who and what. It
// hears them in the order the edge made the changes: a session's
// SessionUp before its binds, a bind before its unbind, its SessionDown
// last. Events come only from the agents' side of the edge (no public
// request or connection makes one), from a goroutine of the watch's own,
// so that a watch may be as slow as it likes but for its queue: past
// 65536 events waiting, further ones are dropped, and the watch hears how
// many with a Lost event, after which it may call Sessions to catch up.
// To start from a known state, watch first, then take a snapshot (an
// event may then tell of a change the snapshot already shows).
package view

import "time"

// Session is an agent session an edge holds.
type Session struct {
	// ID is the session's ID: the one its routes carry
	// (router.Route.SessionID) and its agent was told in its hello's
	// answer.
	ID string `json:"id"`
	// Identity is who the agent is: the edge's Authenticate's answer for
	// its token, or, without one, an anonymous identity ("anonymous-" and
	// hex).
	Identity string `json:"identity"`
	// Remote is the agent's address, as its connection gives it
	// ("203.0.113.7:51000"; a load balancer's, behind one).
	Remote string `json:"remote"`
	// Version is the protocol version the session speaks (docs/PROTOCOL.md).
	Version int `json:"version"`
	// Agent is what the agent called itself in its hello
	// ("tunnelkit-agent"), at most 64 printable characters; empty if it
	// said nothing. The agent chooses it.
	Agent string `json:"agent,omitempty"`
	// Since is when the edge accepted its hello, by the edge's clock
	// (edge.Server.Clock).
	Since time.Time `json:"since"`
	// Endpoints are the endpoints bound on the session, ordered by URL;
	// nil for none.
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is an endpoint bound on a session of an edge, with the traffic
// it had through that edge since it was bound.
type Endpoint struct {
	// URL is the endpoint's public URL, as its agent was told
	// ("https://abc.example.test", "tcp://edge.example.test:20001").
	URL string `json:"url"`
	// Proto is "http", "https", "tls" or "tcp".
	Proto string `json:"proto"`
	// Name is the host name or wildcard the endpoint routes by, or its
	// port for tcp (router.Route.Name).
	Name string `json:"name"`
	// Identity owns the endpoint's name: its session's identity.
	Identity string `json:"identity"`
	// Session is the ID of the session that bound it.
	Session string `json:"session"`
	// Tunnel is its ID within the session (router.Route.TunnelID).
	Tunnel string `json:"tunnel"`
	// Policy is the kinds of traffic policy enforced on it, the agent's
	// and the operator's combined ("cidr_allow", "basic_auth", ...: the
	// Kind constants of package policy), in the order of policy.Spec's
	// fields; nil for none.
	Policy []string `json:"policy,omitempty"`
	// Pool is how many endpoints of the edge's sessions share its
	// protocol and name, itself included: 1 unless its agents asked for a
	// pool (router.Route.Pool). Other edges of a cluster may hold more of
	// the pool.
	Pool int `json:"pool"`
	// Requests is, for http and https, how many HTTP requests the edge
	// took from public clients and sent to the endpoint's agent; for tls
	// and tcp, how many connections its agent was sent, the edge's own
	// and those another edge of its cluster relayed to it. (A relay
	// carries an HTTP connection's requests as bytes: they count below,
	// and as Requests on the edge that took them if that edge holds the
	// endpoint.)
	Requests int64 `json:"requests"`
	// Conns is how many streams to the endpoint's agent are open now: a
	// connection each for tls and tcp; for http and https, the
	// connections to the app that carry requests (a public connection
	// keeps one between its requests).
	Conns int64 `json:"conns"`
	// BytesIn and BytesOut are the bytes sent to the endpoint's agent,
	// and received from it, on those streams: a connection's bytes, or the
	// HTTP requests and responses, headers included, as they cross the
	// tunnel.
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
	// Health is what its agent's health check of its app says (see
	// agent.HealthCheck): HealthUp, HealthDown (nothing is routed to it),
	// or HealthPending (bound, no report yet: nothing is routed to it);
	// empty for an endpoint without a check, which is routed to while its
	// agent is reached.
	Health string `json:"health,omitempty"`
}

// The states of Endpoint.Health.
const (
	HealthUp      = "up"
	HealthDown    = "down"
	HealthPending = "pending"
)

// EventKind is what an Event tells of.
type EventKind string

// The kinds of events, and the fields of Event each sets (beside Kind and
// Time).
const (
	// SessionUp: an agent's hello was accepted. Session, Identity,
	// Remote.
	SessionUp EventKind = "session_up"
	// SessionDown: a session ended, after the Unbind of each of its
	// endpoints. Session, Identity, Remote.
	SessionDown EventKind = "session_down"
	// Bind: an agent bound an endpoint. Session, Identity, Remote, Proto,
	// Name, URL.
	Bind EventKind = "bind"
	// Unbind: an endpoint went, released by its agent or with its
	// session. As Bind.
	Unbind EventKind = "unbind"
	// Health: the agent reported its app up or down (Message: "up", or
	// "down: " and why). As Bind.
	Health EventKind = "health"
	// Update: an agent changed an endpoint in place (its traffic policy,
	// its pool setting), keeping its name and conns. As Bind.
	Update EventKind = "update"
	// Refused: an agent's hello or bind was refused. Session, Remote,
	// Reason, Message; Identity once the hello told who the agent is;
	// Proto and Name as the bind asked for them.
	Refused EventKind = "refused"
	// Drain: the edge began to drain (edge.Server.Drain).
	Drain EventKind = "drain"
	// Lost: the watcher fell behind, and Lost events were dropped for it
	// before this one (see edge.Server.Watch).
	Lost EventKind = "lost"
)

// Event is a change of who is connected to an edge and what they hold.
// Fields its Kind does not set are empty.
type Event struct {
	Kind EventKind `json:"kind"`
	// Time is when it happened, by the edge's clock.
	Time time.Time `json:"time"`
	// Session is the ID of the agent session it is about.
	Session string `json:"session,omitempty"`
	// Identity is the session's identity (see Session.Identity).
	Identity string `json:"identity,omitempty"`
	// Remote is the agent's address (see Session.Remote).
	Remote string `json:"remote,omitempty"`
	// Proto and Name are the endpoint's (see Endpoint), or those a
	// refused bind asked for (a tcp port in decimal; "(any)" for a name
	// or port the edge was to choose).
	Proto string `json:"proto,omitempty"`
	Name  string `json:"name,omitempty"`
	// URL is the endpoint's public URL.
	URL string `json:"url,omitempty"`
	// Reason is the code a refused agent was answered with (the codes of
	// docs/PROTOCOL.md: "unauthorized", "name_taken", "bad_request",
	// "unavailable", ...), and Message what it was told.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Lost is how many events were dropped (kind Lost).
	Lost int `json:"lost,omitempty"`
}
