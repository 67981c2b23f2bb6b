package edge

import "time"

// The control plane's view of the edge, and its lever: the sessions and
// endpoints the edge holds, with their traffic, and Disconnect.

// SessionInfo is an agent session this edge holds, as Sessions reports it.
type SessionInfo struct {
	// ID is the session's ID: the one its routes carry
	// (router.Route.SessionID) and its agent was told in its hello's
	// answer.
	ID string
	// Identity is who the agent is: Authenticate's answer for its token,
	// or, without Authenticate, an anonymous identity ("anonymous-" and
	// hex).
	Identity string
	// Remote is the agent's address, as its connection gives it
	// ("203.0.113.7:51000"; a load balancer's, behind one).
	Remote string
	// Version is the protocol version the session speaks (PROTOCOL.md).
	Version int
	// Agent is what the agent called itself in its hello
	// ("tunnelkit-agent"), at most 64 printable characters; empty if it
	// said nothing. The agent chooses it.
	Agent string
	// Since is when the edge accepted its hello, by Server.Clock.
	Since time.Time
	// Endpoints are the endpoints bound on the session now, ordered by
	// URL; nil for none.
	Endpoints []EndpointInfo
}

// EndpointInfo is an endpoint bound on a session of this edge, with the
// traffic it had through this edge since it was bound, as Endpoints and
// Sessions report it.
type EndpointInfo struct {
	// URL is the endpoint's public URL, as its agent was told
	// ("https://abc.example.test", "tcp://edge.example.test:20001").
	URL string
	// Proto is "http", "https", "tls" or "tcp".
	Proto string
	// Name is the host name or wildcard the endpoint routes by, or its
	// port for tcp (router.Route.Name).
	Name string
	// Identity owns the endpoint's name: its session's identity.
	Identity string
	// Session is the ID of the session that bound it.
	Session string
	// Tunnel is its ID within the session (router.Route.TunnelID).
	Tunnel string
	// Policy is the kinds of traffic policy enforced on it, the agent's
	// and the operator's combined ("cidr_allow", "basic_auth", ...: the
	// Kind constants of package policy), in the order of policy.Spec's
	// fields; nil for none.
	Policy []string
	// Pool is how many endpoints of this edge's sessions share its
	// protocol and name, itself included: 1 unless its agents asked for a
	// pool (router.Route.Pool). Other edges of a cluster may hold more of
	// the pool.
	Pool int
	// Requests is, for http and https, how many HTTP requests this edge
	// took from public clients and sent to the endpoint's agent; for tls
	// and tcp, how many connections its agent was sent, this edge's and
	// those another edge of its cluster relayed here. (A relay carries an
	// HTTP connection's requests as bytes: those are counted below, and
	// as Requests by the edge that took them, on the endpoint only if
	// that edge holds it.)
	Requests int64
	// Conns is how many streams to the endpoint's agent are open now: a
	// connection each for tls and tcp; for http and https, the
	// connections to the app that carry requests (a public connection
	// keeps one between its requests).
	Conns int64
	// BytesIn and BytesOut are the bytes sent to the endpoint's agent,
	// and received from it, on those streams: a connection's bytes, or
	// the HTTP requests and responses, headers included, as they cross
	// the tunnel.
	BytesIn, BytesOut int64
}

// Sessions returns the agent sessions this edge holds now whose hello was
// accepted, ordered by when that was (then by ID), each with its
// endpoints. It is a snapshot taken while the edge serves: each session
// is read under its own lock, consistent within itself, while the others
// go on; the lock of the whole edge is held only to copy the list of
// sessions. No public request or connection waits on it.
func (s *Server) Sessions() []SessionInfo {
	s.init()
	return nil
}

// Endpoints returns the endpoints bound on this edge's sessions now,
// ordered by URL (then by session), each as Sessions reports it, and
// taken as Sessions takes them.
func (s *Server) Endpoints() []EndpointInfo {
	s.init()
	return nil
}

// Disconnect closes every session of identity on this edge now, as if its
// agent had gone, and returns how many it closed. free says what becomes
// of their names: false keeps them for identity for Timeouts.Grace, as
// for any session that ends, so that its agent, connecting again, gets
// them back; true frees them at once (but for the operator's
// reservations, see Reserve).
//
// It does not keep identity from connecting again: withdraw its token
// first, so that Authenticate refuses it. A hello that Authenticate
// accepted before that, and that Disconnect does not see yet, still opens
// a session. In a cluster, it closes this edge's sessions: call it on
// every edge.
func (s *Server) Disconnect(identity string, free bool) int {
	s.init()
	return 0
}
