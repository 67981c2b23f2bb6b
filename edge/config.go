package edge

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// Limits bound what agents and public clients may hold on an edge. In
// every field, zero means the default, given on the field, and a negative
// value means no bound.
type Limits struct {
	// SessionsPerIdentity bounds the sessions one identity holds at once:
	// a hello past it is refused. Zero: 1024.
	SessionsPerIdentity int

	// PendingSessions bounds the agent connections that have not had their
	// hello accepted yet, on agent ports and the public TLS port together
	// (see Server.NoAgentsOnTLS), their TLS handshakes included: past it,
	// of the source (as for PendingSessionsPerSource) that has the most of
	// them, the one waiting longest is closed. Each costs a goroutine and
	// its buffers, for at most Timeouts.Handshake. Zero: 1024.
	PendingSessions int

	// PendingSessionsPerSource bounds the connections of PendingSessions
	// that one source, an IPv4 address or an IPv6 /64 (on the public TLS
	// port, the client's, as for ConnsPerSource), has: past it, the
	// source's own that waits longest is closed. So one source that opens
	// connections that never say hello, however fast, pushes out its own,
	// not an agent elsewhere that needs a few round trips to say its
	// hello. Connections that are not over IP (a pipe, a Unix socket) are
	// one source, which this does not bound. Zero: 64. Behind a load
	// balancer in front of the agent port (which reads no PROXY protocol
	// header there), every agent has its address: set it negative there.
	PendingSessionsPerSource int

	// EndpointsPerSession bounds the endpoints one agent session holds at
	// once: a bind past it is refused as unavailable. Zero: 1024.
	EndpointsPerSession int

	// EndpointsPerIdentity bounds the endpoints one identity holds on
	// this edge at once, over all its sessions: a bind past it is refused
	// as unavailable (ReasonIdentityEndpointLimit). Names kept for the
	// identity (Timeouts.Grace, RestartGrace) count until they are free,
	// here as in EndpointsPerSource and Endpoints; the identity binding one
	// again takes its place. Zero: 4096.
	EndpointsPerIdentity int

	// EndpointsPerSource bounds the endpoints that the anonymous agents
	// (Server.Authenticate nil) of one source address, an IPv4 address or
	// an IPv6 /64, hold on this edge at once: each anonymous agent is an
	// identity of its own, so EndpointsPerIdentity alone would not bound a
	// host that starts many. A bind past it is refused as unavailable
	// (ReasonSourceEndpointLimit). Authenticated agents are not counted.
	// Names kept after a restart (Server.StateDir) count against their
	// identity and Endpoints only: the record does not say where their
	// agents were. Zero: 1024.
	EndpointsPerSource int

	// Endpoints bounds the endpoints on this edge, every agent's
	// together: past it, every bind is refused as unavailable
	// (ReasonEdgeEndpointLimit) until some go. Zero: 65536.
	Endpoints int

	// Reservations bounds the operator's reservations (Server.Reserve)
	// that the Router holds, every identity's together (with a shared
	// Router, the cluster's): past it, Reserve fails with
	// ErrReservationLimit until some are removed; those the Router holds
	// already stay. The in-memory Router's cost about 200 bytes of heap
	// each for short names and identities (2.6 KB for the longest of
	// both), and a line of StateDir's record of 70 bytes (540). Zero:
	// 65536.
	Reservations int

	// ReservationsPerIdentity bounds the operator's reservations for one
	// identity, as Reservations bounds them all. Zero: 1024.
	ReservationsPerIdentity int

	// StreamsPerSession bounds the streams open at once on one agent
	// session, public connections and the agent's requests together: past
	// it, a public connection goes to another agent of the endpoint or is
	// refused, and a stream the agent opens is closed at once. Each stream
	// buffers at most a window of unread bytes (see StreamWindow). Zero:
	// 4096.
	StreamsPerSession int

	// SessionUnread bounds what one agent session may hold for peers that
	// stopped reading: the bytes the agent sent that public clients have
	// not taken yet, together, and as many streams whose sends have
	// waited a second for the agent's window as there are stream windows
	// in it. Past it, the stream stalled the longest is cut (its client
	// gets its stream reset, or its connection closed), so that clients
	// that stop reading hold this much memory at the edge however many of
	// them there are. (The agent bounds its own side likewise: streams
	// whose clients stopped reading pin the app's bytes in its host's
	// socket buffers.) Zero: 32 MiB (128 streams with the default window).
	SessionUnread int

	// AuthFailures is how many failed hellos (a refused token) one source
	// address (an IPv6 /64) may have per minute, with a burst as large.
	// Past it, the source's agent connections are closed as soon as they
	// are accepted, until a minute's share has passed. Zero: 10.
	AuthFailures int

	// RefusedBinds is how many refused binds one identity (for anonymous
	// agents, one source address, an IPv6 /64) may have at once, over all
	// its sessions: past it, its binds wait before the edge looks at them,
	// each refusal adding a second to the wait, so that its refusals come
	// one a second at most (Reason BindThrottled counts the binds that
	// waited; a bind that would wait past its 30 s is refused at once).
	// Binds that succeed cost nothing. A tenant looping binds of a name it
	// cannot have thus takes no more of the edge than that, and no more
	// chances at a name that goes free. Zero: 10.
	RefusedBinds int

	// ClientShare is the part of one endpoint's streams (StreamsPerSession,
	// summed over its pool) that the connections and requests of one
	// public client address (an IPv6 /64) may hold at once: 256 of 4096 by
	// default. Past it, that client's new connections are closed and its
	// requests answered 429, while everyone else is served. It bounds what
	// one address takes; many addresses together can still fill a session
	// (a flood from many hosts is for the network in front of the edge to
	// stop). Zero: 1/16; negative, or 1 and more: no bound.
	ClientShare float64

	// StreamWindow is the most unread bytes each stream of an agent
	// session buffers, at both ends: an agent asking for more gets this
	// much. It is not a bound that can be lifted: zero means 256 KiB, and
	// any value is kept within 64 KiB and 16 MiB.
	StreamWindow int

	// ConnsPerSource bounds the connections one client source (an IPv4
	// address or an IPv6 /64: the client's, from the PROXY protocol header
	// of a load balancer in ProxyProtocolFrom) holds at once on each
	// listener given to ServeHTTPListener or ServeSNI. Past it, the
	// source's new connections on that listener are closed as they are
	// accepted, as ReasonConnLimit (logged at the Debug level only). It
	// bounds what the idle keep-alive connections of one source cost (an
	// idle HTTP/2 connection holds about 32 KiB), which ClientShare does
	// not: they hold no stream. Agent sessions on a ServeSNI listener
	// count there too (see Server.NoAgentsOnTLS). TCP endpoints are not
	// counted here: each of their connections holds a stream, within
	// ClientShare. Zero: 1024,
	// which a browser (six HTTP/1.1 connections per name at most, or one
	// HTTP/2 connection) or a NAT of a hundred browsing users does not
	// meet. Behind a load balancer that sends no PROXY protocol header,
	// every client has its address: set it negative there.
	ConnsPerSource int

	// HandshakesPerSource bounds the TLS handshakes the edge terminates
	// on the ServeSNI listeners (for https endpoints, the public names of
	// Server.ECHKeys and agent sessions) that one client source (as for
	// ConnsPerSource) has under way at once. Past it, the source's next
	// connection for such a handshake waits for one of them to end (its
	// hello unread; at most ConnsPerSource of them wait), and is closed
	// as ReasonHandshakeLimit (logged at the Debug level only) if none
	// ends within Timeouts.Handshake. A full handshake costs the edge
	// about a millisecond of a core: the bound keeps one source from
	// taking the CPU, while a client that opens many connections at once
	// (Go's http.Transport, before its first HTTP/2 connection is up) has
	// them served in turn. Zero: 64.
	HandshakesPerSource int

	// Handshakes bounds the agents' TLS handshakes (on the agent port
	// and on the ServeSNI listeners) whose keys the edge computes at
	// once; the others wait in line, in the order their ClientHellos
	// came, each until its Timeouts.Handshake. A handshake holds its turn
	// from its ClientHello, read whole, to the edge's answer, written:
	// never while it waits for its agent, so that no client holds one
	// for long. When an edge dies and its thousands of agents come to
	// this one at once, the first in line are done in milliseconds, and
	// the sessions already here keep their share of the CPU; with no
	// bound every handshake shares the CPU with all the others, and all
	// of them take longer than their agents wait (10 s). Zero: twice
	// the CPUs the Go runtime uses (GOMAXPROCS), and at least 4;
	// negative: no bound.
	Handshakes int
}

// Timeouts bound how long an edge waits. In every field, zero means the
// default, given on the field, and a negative value means no bound (never).
type Timeouts struct {
	// Handshake bounds the time an agent has to send its hello, any peer
	// to send a stream's header, a public client its TLS hello or HTTP
	// request header, and a dial to an agent. Zero: 10 s.
	Handshake time.Duration

	// HeartbeatInterval and HeartbeatTimeout set how often the edge pings
	// each agent and how long it waits, past the interval, for anything at
	// all from the agent before it closes the session (with ping streams
	// on a timer for agents of protocol version 3, a heartbeat stream for
	// version 2; see docs/PROTOCOL.md). Zero: 30 s and 15 s. They cannot be
	// disabled.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration

	// ConnIdle closes a public TLS or TCP connection that moved no byte
	// either way for that long. Zero: 10 minutes.
	ConnIdle time.Duration

	// HTTPIdle closes a public HTTP keep-alive connection idle for that
	// long, and ends an HTTP exchange whose bytes stopped moving for that
	// long while they were due: a request body the agent stopped reading,
	// a response body or an upgraded connection (a WebSocket) that went
	// silent, a client that stopped reading its response. Waiting for the
	// app's answer is ResponseHeader's business. An app that hung in the
	// middle of its answer looks like a long-lived stream between two
	// messages: an event stream (text/event-stream), a streamed long poll
	// or a WebSocket that sends nothing for HTTPIdle is ended too, however
	// alive its client (a browser's EventSource then connects again). Such
	// apps send something more often (an event stream a comment line,
	// ":\n"), or the bound is raised or lifted; a client that leaves ends
	// its exchange without it. Zero: 2 minutes.
	HTTPIdle time.Duration

	// ResponseHeader bounds how long the edge waits for an agent's app to
	// start answering an HTTP request, once the request was sent whole;
	// past it the client gets 504. Zero: 5 minutes (long polls fit).
	ResponseHeader time.Duration

	// Body bounds the wait for each read of a public HTTP request's body,
	// as nginx's client_body_timeout does: a body that stops moving for
	// that long is cut off and the client gets 408. A traffic policy's
	// webhook check, which reads the body whole (at most 1 MiB) before the
	// request goes on, has Body for all of it. Zero: 60 s.
	Body time.Duration

	// Grace is how long the names of an agent session that ended stay
	// reserved for its identity, so that the agent, reconnecting, gets its
	// URLs back and nobody else can take them meanwhile. Meanwhile they
	// count against this edge's quotas of endpoints (Limits) as when they
	// were bound, until the identity binds them again here (bound on
	// another edge of a cluster, they count here until the grace ends).
	// Zero: 30 s; negative: names are free at once. Names an agent
	// unbinds itself are free at once.
	Grace time.Duration

	// RestartGrace is how long after a restart the names that the edge's
	// record (Server.StateDir) says were held when it stopped stay
	// reserved for the identities that held them: nobody else binds them,
	// or a name in their trees, meanwhile, whatever ticket they show, and
	// they count against the quotas of endpoints of Limits as Grace's
	// names do. Other names are served at once. Zero: Grace; negative:
	// the names are not kept. Without a record (StateDir empty, or a
	// Router of your own, which keeps its names itself) a restart has
	// nothing to keep.
	RestartGrace time.Duration

	// TicketLifetime is how long an endpoint ticket is good for; agents
	// renew theirs at half of it. Zero: 1 hour. It cannot be disabled.
	TicketLifetime time.Duration

	// SessionTicketLifetime is how long a session ticket is good for: an
	// older one gives no identity back (an anonymous agent presenting it
	// is a new identity) and takes over no session. Agents of protocol
	// version 5 renew theirs while connected, with their endpoint tickets.
	// It also bounds how long Server.Disconnect's revocation of an
	// anonymous identity is kept. Zero: 7 days. It cannot be disabled.
	SessionTicketLifetime time.Duration

	// Move bounds Drain's wait, in a cluster, for the agents it asked to
	// move to say they did. Zero: 10 s; negative: Drain's context's end.
	Move time.Duration

	// DrainNotice is how long Drain takes public connections at least, for
	// load balancers to see that the edge drains (see Draining). Zero or
	// negative: none (HAProxy's retry-on conn-failure needs none).
	DrainNotice time.Duration
}

// Defaults.
const (
	DefaultSessionsPerIdentity      = 1024
	DefaultPendingSessions          = 1024
	DefaultPendingSessionsPerSource = 64
	DefaultEndpointsPerSession      = 1024
	DefaultEndpointsPerIdentity     = 4096
	DefaultEndpointsPerSource       = 1024
	DefaultEndpoints                = 65536
	DefaultReservations             = 65536
	DefaultReservationsPerIdentity  = 1024
	DefaultStreamsPerSession        = 4096
	DefaultSessionUnread            = 32 << 20
	DefaultAuthFailures             = 10
	DefaultRefusedBinds             = 10
	DefaultClientShare              = 1.0 / 16
	DefaultConnsPerSource           = 1024
	DefaultHandshakesPerSource      = 64

	DefaultHandshakeTimeout      = 10 * time.Second
	DefaultConnIdleTimeout       = 10 * time.Minute
	DefaultHTTPIdleTimeout       = 2 * time.Minute
	DefaultResponseHeaderTimeout = 5 * time.Minute
	DefaultBodyTimeout           = 60 * time.Second
	DefaultGrace                 = 30 * time.Second
	DefaultTicketLifetime        = time.Hour
	DefaultSessionTicketLifetime = 7 * 24 * time.Hour
	DefaultMoveTimeout           = 10 * time.Second
)

// config is a Server's settings resolved once: every limit and timeout a
// number, zero for no bound.
type config struct {
	sessionsPerIdentity int
	pendingSessions     int
	pendingPerSource    int
	endpointsPerSession int
	endpointsPerID      int
	endpointsPerSource  int
	endpoints           int
	reservations        int
	reservationsPerID   int
	streamsPerSession   int
	sessionUnread       int
	authFailures        int
	refusedBinds        int
	clientShare         float64
	window              uint32
	connsPerSource      int
	handshakesPerSource int
	handshakes          int

	handshake         time.Duration
	heartbeatInterval time.Duration
	heartbeatTimeout  time.Duration
	connIdle          time.Duration
	httpIdle          time.Duration
	responseHeader    time.Duration
	body              time.Duration
	grace             time.Duration
	restartGrace      time.Duration
	ticketLifetime    time.Duration
	sessionTickets    time.Duration // SessionTicketLifetime
	move              time.Duration
	drainNotice       time.Duration

	proxyFrom []netip.Prefix // the load balancers' addresses, IPv4 unmapped
}

// limit resolves a limit: def for zero, none (0) for negative.
func limit(v, def int) int {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// timeout resolves a timeout: def for zero, none (0) for negative.
func timeout(v, def time.Duration) time.Duration {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// positive resolves a duration that cannot be disabled: def for zero or
// negative.
func positive(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Min, Max int }

// ParsePortRange parses "20000-20100" or a single port "20000".
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, found := cutDash(s)
	min, err1 := strconv.Atoi(lo)
	max := min
	var err2 error
	if found {
		max, err2 = strconv.Atoi(hi)
	}
	r := PortRange{min, max}
	if err1 != nil || err2 != nil || !r.valid() {
		return PortRange{}, fmt.Errorf("edge: bad port range %q: want MIN-MAX within 1-65535", s)
	}
	return r, nil
}

func cutDash(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '-' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func (r PortRange) valid() bool { return 1 <= r.Min && r.Min <= r.Max && r.Max <= 65535 }

func (r PortRange) contains(p int) bool { return r.valid() && r.Min <= p && p <= r.Max }

// Dialer opens the conn that carries one public connection to the agent of
// a route. The edge writes nothing to the returned conn before the client's
// bytes and owns it afterwards (it closes it).
type Dialer interface {
	DialRoute(ctx context.Context, r router.Route, c ConnInfo) (net.Conn, error)
}

// ConnInfo describes a public connection.
type ConnInfo struct {
	Client netip.AddrPort // the public client's address
	Host   string         // the HTTP Host or TLS server name
}
