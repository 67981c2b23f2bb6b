package edge

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/internal/drain"
	"github.com/tunnelkit/tunnelkit/edge/internal/limits"
	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/edge/internal/policies"
	"github.com/tunnelkit/tunnelkit/edge/internal/upstream"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// Server is an edge: it accepts agent sessions and routes public traffic to
// them. Its zero value with a Domain set is ready to use, with an in-memory
// router. Its fields are read when it starts serving (see Start) and must
// not change afterwards; the Server never writes them. A Server must not be
// copied after first use.
type Server struct {
	// Domain is the domain HTTP endpoints live under: an agent that binds
	// the name "abc" is reached at abc.<Domain>. Required for HTTP.
	Domain string

	// ID names this edge in a cluster of edges sharing one Router: it is
	// stamped on the routes it binds (Route.Edge), so that the others know
	// which edge holds the agent (see Relay). Empty: a lone edge.
	ID string

	// HTTPPort is the port written into public HTTP URLs handed to agents.
	// Empty: the port of the listener given to Start (or to the first
	// ServeHTTPListener call), or none (port 80) when the Server is only
	// used as an http.Handler.
	HTTPPort string

	// TLSPort is the port written into public TLS and https URLs. Empty:
	// the port of the TLS listener given to Start (or to the first ServeSNI
	// call).
	TLSPort string

	// TCPPorts is the range of ports agents may bind TCP endpoints on.
	// Zero: TCP endpoints are refused.
	TCPPorts PortRange

	// TCPListenHost is the address TCP endpoints listen on. Empty:
	// "127.0.0.1". When it is unspecified ("0.0.0.0", "::"), TCP URLs name
	// Domain instead.
	TCPListenHost string

	// Certificates are the operator's certificates for https endpoints,
	// such as one for "*.<Domain>": a terminated handshake gets the first
	// that covers its server name (and suits the client's algorithms).
	Certificates []tls.Certificate

	// GetCertificate, if set, is asked first for the certificate of a
	// terminated handshake; returning nil and no error passes on to
	// Certificates, then ACME.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)

	// ACME, if set, gets certificates for https endpoints from an ACME CA
	// on demand (see package github.com/tunnelkit/tunnelkit/edge/acme).
	//
	// Agents may bind https endpoints only when the edge has a source of
	// certificates: Certificates, GetCertificate or ACME. They are served
	// on the ServeSNI listeners beside tls endpoints, chosen by server
	// name, with HTTP/2 and HTTP/1.1.
	ACME *ACME

	// ECHKeys, if set, let the edge route TLS connections that use
	// Encrypted ClientHello by the name the client asked for, still
	// without terminating them (ECH's split mode): the edge decrypts the
	// ClientHello, routes by its inner server name, and sends the inner
	// hello, then the client's bytes untouched, to the agent, whose TLS
	// server (any crypto/tls server since Go 1.24) completes the
	// handshake without a key of its own. https endpoints accept ECH too,
	// through crypto/tls, with the same keys.
	//
	// The public names of the keys' configurations belong to the
	// operator, with their trees (see router.Router, rule 2): a bind of a
	// public name, of a name above it (a wildcard over it, or a catch-all,
	// see AllowCatchAll) or of a name under it is refused as taken
	// (name_taken), whoever asks; the Server refuses to start with a
	// public name that is Domain or above it. A connection whose ECH does
	// not decrypt (a stale configuration, or GREASE) goes by its outer
	// name. For a public name (with such ECH or none), the edge always
	// completes the handshake itself, whatever routes the Router holds,
	// with its own certificate (Certificates, GetCertificate), and sends
	// the keys marked SendAsRetry as retry configurations to a client
	// whose ECH did not decrypt, so that it tries again with them. Make
	// keys with sni.NewECHKey (sni.MarshalECHKeyPEM and sni.ParseECHKeyPEM
	// for files).
	ECHKeys []tls.EncryptedClientHelloKey

	// RedirectHTTP answers a plain-HTTP request for a name bound over
	// https only with 308 Permanent Redirect to its https URL. False: 404
	// with the code https_only.
	RedirectHTTP bool

	// AllowCatchAll lets agents bind "*" and "*.<Domain>": a wildcard
	// over every name under the domain, which makes its owner the owner of
	// every name (see router.Router). Leave it off on a multi-tenant edge.
	// Even so, a catch-all is refused while a public name of ECHKeys is
	// under Domain: it would own that name, which is the operator's; give
	// the keys a public name outside Domain to have both.
	AllowCatchAll bool

	// Router decides where public traffic goes. Nil: a router.MemoryRouter.
	Router router.Router

	// Dialer opens the conn to a route's agent. Nil: the Server itself,
	// which opens a stream on the agent's session (see DialRoute).
	Dialer Dialer

	// Authenticate checks the token an agent presents in its hello and
	// returns the agent's identity, which owns the names it binds (see
	// router.Router for the rules). Nil: every agent is accepted, and each
	// is an identity of its own ("anonymous-" and random hex), which it
	// keeps across reconnections through its session ticket; agents can
	// then not share a pool.
	Authenticate func(ctx context.Context, token string) (identity string, err error)

	// TicketKey signs the tickets the edge gives agents (at least 32
	// bytes; the Server refuses to start with a shorter one). A session
	// ticket lets a reconnecting agent take over its previous session's
	// endpoints at once, and gives an anonymous agent (Authenticate nil)
	// its identity back, and so its names, after a restart (see StateDir).
	// Keep the key secret, and the same across restarts of an edge and
	// across the edges of a cluster: a ticket signed under another key is
	// ignored. Nil: a random key per Server, so that tickets do not
	// survive a restart.
	//
	// The cookies of OIDC logins (see OIDC) are sealed under a key derived
	// from it: edges sharing TicketKey accept each other's logins, and a
	// restart keeps them. Without it, every login ends with a restart.
	TicketKey []byte

	// Policy, if set, is the operator's traffic policy for the endpoints of
	// an identity (return the same for every identity to set one for the
	// whole edge): what holds on each endpoint, whatever its agent
	// declares, and which kinds and OIDC issuers agents may declare (see
	// policy.Operator; policy.Combine says how the operator's policy and
	// the agent's are combined). It is asked when an endpoint is bound,
	// and when this edge first takes traffic for an endpoint that another
	// edge of its cluster bound; give every edge of a cluster the same.
	// It must be safe for concurrent use. A bind whose policy it caps or
	// conflicts with is refused (bad_request). Nil: no operator policy;
	// agents may declare any kind.
	//
	// The edge enforces the combined policy before it opens a stream to
	// the agent: on each request of http and https endpoints (refusals are
	// answered as the edge's own, with the Reasons of package policy's
	// codes, such as 403 policy_denied or 429 rate_limited), and on each
	// connection of tls and tcp endpoints (closed when refused).
	Policy func(identity string) policy.Operator

	// OIDC makes the provider of an oidc policy when an endpoint that has
	// one is bound (see policy.Options.OIDC; package
	// github.com/tunnelkit/tunnelkit/policy/oidc, a module of its own, has
	// one: oidc.Providers.Provider). An error that wraps policy.ErrInvalid,
	// ErrForbidden or ErrUnsupported refuses the bind (bad_request); any
	// other makes it unavailable (try again later). Nil: oidc policies are
	// refused as unsupported (bad_request).
	OIDC func(ctx context.Context, cfg policy.OIDCConfig) (policy.Provider, error)

	// PolicyEngine compiles the expressions of traffic policy rules (see
	// policy.Engine; package github.com/tunnelkit/tunnelkit/policy/rules, a
	// module of its own, has one: rules.Engine). Nil: an endpoint whose
	// rules have expressions or interpolations is refused (bad_request,
	// naming the rule); the kinds, and rules without expressions, need
	// none.
	PolicyEngine policy.Engine

	// Clock is the edge's clock for what it dates and lets expire: the
	// tickets it issues, the names it keeps for their holders (the grace
	// of a session's names, Timeouts.Grace, and the restart grace of
	// StateDir: the in-memory router's reservations, and their count
	// against the quotas of Limits; a Router of your own keeps its
	// reservations by its own clock), and traffic policies (rate limits'
	// refills, webhook timestamps, the expiry of OIDC logins). Nil:
	// time.Now. It is for tests; deadlines and timeouts on connections
	// keep the system clock.
	Clock func() time.Time

	// StateDir, if set, is a directory where the edge keeps a record of
	// who holds which name (the file names.jsonl), written as agents bind
	// and release them, so that a restart gives each name back to the
	// identity that held it when the edge stopped, and to no one else:
	// the names of the record stay reserved for those identities for
	// Timeouts.RestartGrace, as a session's names do when it ends (see
	// router.Router, rule 4). Every other name is served at once. No
	// record in the directory is a first start: every name is served at
	// once. An authenticated identity gets its names back with its token;
	// an anonymous agent with its session ticket, which needs TicketKey
	// kept too. Keep one Server per directory; the Server refuses to start
	// when it cannot read or write the record, when group or others may
	// write to the directory, and when a link or a special file is in the
	// record's place.
	//
	// Empty: no record, and every start is a first start; names held
	// before a restart go to whoever asks first. StateDir is used with the
	// in-memory router only (Router nil): a Router of your own keeps who
	// holds which name itself.
	StateDir string

	// AgentTLS, if set, makes ServeAgents speak TLS with this
	// configuration to every agent. Nil: the listener's conns are used as
	// they are (plaintext, or TLS the caller set up).
	AgentTLS *tls.Config

	// NoAgentsOnTLS keeps agent sessions off the ServeSNI listeners.
	// False: an edge with a source of certificates (Certificates,
	// GetCertificate or ACME) takes agent sessions there too, beside
	// public TLS, so that an agent whose network lets out port 443 alone
	// reaches it: a ClientHello that offers the ALPN protocol
	// "tunnelkit/1" is an agent's, unless its server name (the inner one,
	// when the edge decrypts ECH) is passed through to a tls endpoint,
	// which gets it untouched whatever it offers. The edge completes an
	// agent's handshake with its own certificate for the name the agent
	// dialled (the first of Certificates for an agent that dialled an IP
	// address and so sent no name; ACME has certificates for endpoints
	// only), and serves the session as ServeAgents does: the same
	// Authenticate, limits and tickets; AgentTLS does not apply there. Its
	// handshake counts against Limits.HandshakesPerSource, its
	// connection against Limits.ConnsPerSource, and, until its hello is
	// accepted, against Limits.PendingSessions. Give agents a name that no
	// agent can bind over tls (Domain itself, a name outside it, a public
	// name of ECHKeys) or an IP address: an agent that dials a name under
	// Domain reaches whoever binds that name over tls, who would see its
	// token if it had a certificate for the name. docs/PROTOCOL.md has the
	// rule.
	NoAgentsOnTLS bool

	// ProxyProtocolFrom are the addresses of the load balancers in front
	// of the edge that send a PROXY protocol header (version 1 or 2) at the
	// start of each connection to the public listeners (ServeHTTPListener,
	// ServeSNI and TCP endpoints). Empty: no PROXY protocol; every
	// connection is a client's, at its own address.
	//
	// A connection from these prefixes must start with a valid header,
	// whose source is then the client's address: the one its share of an
	// endpoint (Limits.ClientShare) is counted by, written in
	// X-Forwarded-For and handed to the agent. One without (or with a
	// malformed one, or none within Timeouts.Handshake) is closed. A
	// header with the LOCAL command (a health check) leaves the
	// connection at the load balancer's own address.
	//
	// A connection from any other address is a client reaching the edge
	// directly: it is served at its own address and never read for a
	// header, so that no client can choose the address it appears to come
	// from. On ServeHTTPListener and ServeSNI, whose clients speak first,
	// one whose first bytes are a PROXY signature (version 1's "PROXY " or
	// version 2's 12 bytes) is closed, as ReasonProxyUntrusted, and logged
	// at the Debug level only; on TCP endpoints its bytes go to the agent
	// untouched, whatever they are (a server that speaks first must not
	// wait for the client). IPv4 peers, IPv4-mapped ones included, match
	// IPv4 prefixes (or IPv4-mapped ones); the Server refuses to start
	// with an invalid prefix.
	ProxyProtocolFrom []netip.Prefix

	// NotTLS receives the connections on ServeSNI listeners that are not
	// TLS, with every byte read so far replayed, and owns them. Nil: they
	// are closed.
	NotTLS func(net.Conn)

	// Limits bound what agents and public clients may hold; zero fields
	// take their defaults (see Limits).
	Limits Limits

	// Timeouts bound how long the edge waits; zero fields take their
	// defaults (see Timeouts).
	Timeouts Timeouts

	// AccessLog, if set, gets one line per public HTTP request: method,
	// host, path, protocol, status, bytes, duration and client. Nil: none.
	AccessLog *slog.Logger

	// Logger receives the server's logs. Nil: they are discarded.
	Logger *slog.Logger

	// Observer, if set, hears what happens on the edge, to count it (see
	// Observer). Nil: nothing is counted.
	Observer Observer

	initOnce sync.Once
	// testHookLookup, when set (by a test, before the Server runs), runs
	// with the context of each lookup, before the Router is asked.
	testHookLookup func(context.Context)
	conf           atomic.Pointer[config] // resolved at init; SetLimits swaps it
	cfgErr         error                  // what is wrong with the fields; the Serve methods return it
	proxyLog       *log.Logger            // ReverseProxy's own messages, at the debug level
	mem            *router.MemoryRouter
	signer         names.Signer
	record         *names.Record // the in-memory router, recorded in StateDir; nil without
	auth           *limits.AuthGuard
	shares         limits.Shares[endpointKey]
	ups            upstream.Pool
	term           terminating
	ech            echState

	policies  policies.Cache // compiled traffic policies, by endpoint
	cookieKey []byte         // of OIDC logins, derived from the ticket key

	quotas  limits.Quotas[endpointKey] // the quotas of Limits
	bindLog limits.LogBudget           // lines about refused binds
	binds   limits.BindGuard           // refused binds, by owner (Limits.RefusedBinds)
	pending limits.Pending             // agent conns waiting for their hello, by source
	turns   limits.Turns               // agents' TLS handshakes computed at once (Limits.Handshakes)
	evicted atomic.Int64               // pending conns closed to make room

	reserveMu sync.Mutex // one Reserve counts and adds at a time

	watchOnce sync.Once
	stopWatch func()               // stops watching a shared Router's routes
	events    book.Hub[view.Event] // the watchers of Watch

	moves drain.Moves[*session] // the sessions Drain asked to move, until they did or ended

	// movesInFlight bounds the agents a drain has moving at once; zero:
	// defaultMovesInFlight (tests set it: SetMovesInFlight).
	movesInFlight int

	// watcher keeps the agent sessions of wire.PingFrameVersion and later
	// alive, from one goroutine for them all.
	watcher wire.Watcher

	mu          sync.Mutex
	closed      bool
	draining    bool                      // Drain was called
	agentLns    map[net.Listener]struct{} // the listeners of ServeAgents, which Drain closes
	stopping    chan struct{}             // closed with closed: waiters for a handshake slot give up
	httpPort    string                    // the ports URLs name, from HTTPPort and TLSPort or the listeners
	tlsPort     string
	sessions    map[string]*session
	perIdentity map[string]int // sessions that said hello, by identity
	listeners   map[net.Listener]struct{}
	servers     map[*http.Server]struct{}
	tcp         map[string]*tcpEndpoint // by port
	connCounts  []*limits.Count         // the bounds of ConnsPerSource of the listeners
	wg          sync.WaitGroup          // session and listener goroutines

	// The hot paths (every conn accepted, every stream relayed, every
	// hello) read the server's state without mu, which the goroutines
	// of thousands of agents coming back at once would otherwise queue
	// on, and the accept loops behind them.
	isShut     atomic.Bool           // closed, set under mu and wgMu together
	isDraining atomic.Bool           // draining, set under mu
	wgMu       sync.RWMutex          // wg.Add under its read lock; closing under its lock
	connsMu    sync.Mutex            // conns
	conns      map[net.Conn]struct{} // public TLS and TCP conns, and their streams
}

// setLimits resolves l into c (but for StreamWindow, which a session
// settles at its start for good).
func (c *config) setLimits(l Limits) {
	c.sessionsPerIdentity = limit(l.SessionsPerIdentity, DefaultSessionsPerIdentity)
	c.pendingSessions = limit(l.PendingSessions, DefaultPendingSessions)
	c.pendingPerSource = limit(l.PendingSessionsPerSource, DefaultPendingSessionsPerSource)
	c.endpointsPerSession = limit(l.EndpointsPerSession, DefaultEndpointsPerSession)
	c.endpointsPerID = limit(l.EndpointsPerIdentity, DefaultEndpointsPerIdentity)
	c.endpointsPerSource = limit(l.EndpointsPerSource, DefaultEndpointsPerSource)
	c.endpoints = limit(l.Endpoints, DefaultEndpoints)
	c.reservations = limit(l.Reservations, DefaultReservations)
	c.reservationsPerID = limit(l.ReservationsPerIdentity, DefaultReservationsPerIdentity)
	c.streamsPerSession = limit(l.StreamsPerSession, DefaultStreamsPerSession)
	c.sessionUnread = limit(l.SessionUnread, DefaultSessionUnread)
	c.authFailures = limit(l.AuthFailures, DefaultAuthFailures)
	c.refusedBinds = limit(l.RefusedBinds, DefaultRefusedBinds)
	c.connsPerSource = limit(l.ConnsPerSource, DefaultConnsPerSource)
	c.handshakesPerSource = limit(l.HandshakesPerSource, DefaultHandshakesPerSource)
	c.handshakes = limit(l.Handshakes, max(4, 2*runtime.GOMAXPROCS(0)))
	switch c.clientShare = l.ClientShare; {
	case c.clientShare == 0:
		c.clientShare = DefaultClientShare
	case c.clientShare < 0 || c.clientShare >= 1:
		c.clientShare = 0
	}
}

// cfg returns the Server's settings as resolved: zero before init.
func (s *Server) cfg() *config {
	if c := s.conf.Load(); c != nil {
		return c
	}
	return &config{}
}

// init resolves the Server's settings, once.
func (s *Server) init() {
	s.initOnce.Do(func() {
		c, err := s.resolve()
		s.conf.Store(&c)
		s.cfgErr = err
		s.mem = &router.MemoryRouter{Clock: s.Clock}
		s.stopping = make(chan struct{})
		if s.cfgErr == nil && s.StateDir != "" && s.Router == nil {
			var err error
			if s.record, err = names.Open(s.StateDir, s.mem, s.cfg().restartGrace, s.log(), s.now); err != nil {
				s.cfgErr = fmt.Errorf("edge: StateDir: %w", err)
			} else {
				// The names a restart keeps count against the quotas of
				// the identities that held them. The record does not say
				// where anonymous agents were: they count against no source.
				for name, h := range s.record.Restored() {
					s.quotas.KeepRestored(limits.Owner{Identity: h.Identity}, name, h.Until, s.now())
				}
			}
		}
		s.watcher.Interval, s.watcher.Timeout = s.cfg().heartbeatInterval, s.cfg().heartbeatTimeout
		s.proxyLog = slog.NewLogLogger(s.log().Handler(), slog.LevelDebug)
		s.httpPort, s.tlsPort = s.HTTPPort, s.TLSPort
		s.signer.Key = s.TicketKey
		if len(s.signer.Key) == 0 {
			s.signer.Key = make([]byte, names.MinTicketKey)
			rand.Read(s.signer.Key)
		}
		s.cookieKey = deriveCookieKey(s.signer.Key)
		s.ups.ResponseHeaderTimeout, s.ups.StreamWindow = s.cfg().responseHeader, int(s.cfg().window)
		s.ups.IsRefusal = func(err error) bool { return errors.Is(err, ErrAppUnreachable) || errors.Is(err, ErrNoEndpoint) }
		s.policies.Max, s.policies.Retry, s.policies.Timeout, s.policies.Now = maxCachedPolicies, policyRetry, policyCompileTimeout, s.now
		s.auth = &limits.AuthGuard{PerMinute: s.cfg().authFailures, Log: s.log()}
		s.binds.PerSecond, s.binds.Burst = bindsPerSecond(s.cfg().refusedBinds), s.cfg().refusedBinds
		s.pending.Max, s.pending.PerSource = s.cfg().pendingSessions, s.cfg().pendingPerSource
		s.quotas.Edge, s.quotas.PerIdentity, s.quotas.PerSource = s.cfg().endpoints, s.cfg().endpointsPerID, s.cfg().endpointsPerSource
		if s.cfgErr == nil {
			s.logStart()
		}
	})
}

// logStart tells the operator, once, what the edge starts with that is
// easily got wrong: the public names of its ECH keys, certificates that
// cover neither names under Domain nor those public names, and a ticket
// key kept across restarts without a record of names.
func (s *Server) logStart() {
	log := s.log()
	var public []string
	if s.initECH() == nil {
		public = slices.Sorted(maps.Keys(s.ech.publicNames))
		if len(public) > 0 {
			log.Info("ECH keys loaded", "keys", len(s.ECHKeys), "public_names", public)
		}
	}
	if len(s.Certificates) > 0 {
		s.checkCertificates(public)
	}
	if len(s.TicketKey) > 0 && s.StateDir == "" && s.Router == nil {
		log.Warn("TicketKey is set, StateDir is not: names held before a restart go to whoever asks first after it; set StateDir to keep them for their holders")
	}
}

// checkCertificates warns when the operator's certificates cover neither
// a name under Domain nor a public name of the ECH keys (a certificate for
// another domain, most likely), and names the public names none covers.
func (s *Server) checkCertificates(public []string) {
	domain, _ := router.Normalise(s.Domain)
	certNames, coversDomain, uncovered := names.Certified(s.Certificates, domain, public)
	switch {
	case !coversDomain && len(uncovered) == len(public):
		s.log().Warn("the certificates of Certificates cover neither a name under the domain nor a public name of the ECH keys: https endpoints need ACME or GetCertificate", "domain", domain, "ech_public_names", public, "certificate_names", certNames)
	case len(uncovered) > 0 && s.GetCertificate == nil:
		s.log().Warn("no certificate of Certificates covers these public names of the ECH keys: the edge cannot complete the handshakes of clients whose ECH configuration is stale", "ech_public_names", uncovered, "certificate_names", certNames)
	}
}

// Listeners are the listeners Start serves. A nil one is not served.
type Listeners struct {
	Agents net.Listener // agent sessions (see ServeAgents)
	HTTP   net.Listener // public HTTP (see ServeHTTPListener)
	TLS    net.Listener // public TLS: tls:// passed through, https:// terminated, agent sessions by ALPN (see ServeSNI)
}

// Start serves ls, each in a goroutine that Close and Shutdown stop and
// wait for, and returns once the listeners are registered: the public
// listeners' ports are then known to every URL the edge hands out, from
// the first bind on. It returns the error that keeps the Server from
// starting (an invalid field), having closed the listeners; a listener
// that fails later is logged at the Error level.
func (s *Server) Start(ls Listeners) error {
	s.init()
	all := []net.Listener{ls.Agents, ls.HTTP, ls.TLS}
	closeAll := func() {
		for _, ln := range all {
			if ln != nil {
				ln.Close()
			}
		}
	}
	err := s.cfgErr
	if err == nil {
		err = s.initECH()
	}
	if err != nil {
		closeAll()
		return err
	}
	if ls.HTTP != nil {
		s.notePort(&s.httpPort, ls.HTTP)
	}
	if ls.TLS != nil {
		s.notePort(&s.tlsPort, ls.TLS)
	}
	serve := []struct {
		ln net.Listener
		f  func(net.Listener) error
	}{{ls.HTTP, s.ServeHTTPListener}, {ls.TLS, s.ServeSNI}, {ls.Agents, s.ServeAgents}}
	for _, sv := range serve {
		if sv.ln == nil {
			continue
		}
		serve := func() {
			if err := sv.f(sv.ln); !errors.Is(err, ErrServerClosed) {
				s.log().Error("listener failed", "addr", sv.ln.Addr().String(), "err", err)
			}
		}
		if !s.goTracked(serve) {
			closeAll()
			return ErrServerClosed
		}
	}
	return nil
}

// notePort makes the port of ln the one URLs name in *port, unless one is
// set already.
func (s *Server) notePort(port *string, ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *port == "" {
		if _, p, err := net.SplitHostPort(ln.Addr().String()); err == nil {
			*port = p
		}
	}
}

func (s *Server) router() router.Router {
	if s.Router != nil {
		return s.Router
	}
	s.init()
	if s.record != nil {
		return s.record
	}
	return s.mem
}

// lookup asks the Router for the routes of name for proto. A Router of
// the operator's (a store, a control plane) gets a deadline,
// Timeouts.Handshake, whatever ctx (a public request's has none), and is
// not cut short by a client that half-closes (net/http ends the request's
// context then, while the client waits for its answer); the edge's own
// in-memory router answers at once, and is asked as it is.
func (s *Server) lookup(ctx context.Context, proto, name string) ([]router.Route, error) {
	if s.testHookLookup != nil {
		s.testHookLookup(ctx)
	}
	if s.Router == nil {
		return s.router().Lookup(ctx, proto, name)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg().handshake)
	defer cancel()
	return s.Router.Lookup(ctx, proto, name)
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return discard
	}
	return s.Logger
}

var discard = slog.New(slog.DiscardHandler)

// ServeAgents accepts agent sessions on ln until ln fails or the server is
// closed, then returns an error (ErrServerClosed after Close or Shutdown).
func (s *Server) ServeAgents(ln net.Listener) error {
	s.init()
	if s.cfgErr != nil {
		ln.Close()
		return s.cfgErr
	}
	s.watchRoutes()
	track(s, &s.agentLns, ln, true) // for Drain to close; serve closes it once the server is
	defer track(s, &s.agentLns, ln, false)
	return s.serve(ln, "agents", s.serveSession)
}

// serve accepts conns on ln until ln fails or the server is closed, and
// runs handle for each in a goroutine that Close waits for. It backs off
// on temporary errors (out of file descriptors), and returns
// ErrServerClosed after Close or Shutdown.
func (s *Server) serve(ln net.Listener, what string, handle func(net.Conn)) error {
	s.init()
	if !s.trackListener(ln, true) {
		ln.Close()
		return ErrServerClosed
	}
	defer s.trackListener(ln, false)
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log().Warn("accept", "listener", what, "err", err, "retry_in", delay)
				time.Sleep(delay)
				continue
			}
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return ErrServerClosed
			}
			return err
		}
		delay = 0
		if !s.goTracked(func() { handle(c) }) {
			c.Close()
		}
	}
}

// ServeHTTPListener serves public HTTP on ln until the server is shut down;
// a client source's connections past Limits.ConnsPerSource are closed as
// they are accepted. It returns ErrServerClosed after Close or Shutdown.
func (s *Server) ServeHTTPListener(ln net.Listener) error {
	s.init()
	if s.cfgErr != nil {
		ln.Close()
		return s.cfgErr
	}
	s.notePort(&s.httpPort, ln)
	hs := s.newHTTPServer(s, "http")
	// HTTP/2 without TLS, for clients that know the edge speaks it (prior
	// knowledge), beside HTTP/1.1.
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs.Protocols = p
	if !s.trackServer(hs) {
		ln.Close()
		return ErrServerClosed
	}
	err := hs.Serve(s.perSource(s.clientFirstListener(ln)))
	if errors.Is(err, http.ErrServerClosed) {
		err = ErrServerClosed
	}
	return err
}

// trackServer registers hs so that Close and Shutdown stop it, unless the
// server is closed.
func (s *Server) trackServer(hs *http.Server) bool {
	return track(s, &s.servers, hs, true)
}

// newHTTPServer returns an http.Server for public HTTP connections of
// proto (http, or https for TLS the edge terminated).
func (s *Server) newHTTPServer(h http.Handler, proto string) *http.Server {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg().handshake,
		IdleTimeout:       s.cfg().httpIdle,
		ErrorLog:          s.proxyLog,
	}
	s.ups.Track(hs, func() { s.obs().Conn(proto) })
	return hs
}

// Close closes every listener, public HTTP connection and agent session at
// once, and waits for the server's goroutines. It is safe to call more than
// once.
func (s *Server) Close() error {
	s.init()
	s.stopWatching()
	s.stop()
	s.mu.Lock()
	for hs := range s.servers {
		hs.Close()
	}
	s.mu.Unlock()
	s.closeSessions()
	s.closeConns()
	s.watcher.Close()
	s.wg.Wait()
	s.events.Close()
	s.auth.Flush()
	s.record.Stop()
	s.stopACME()
	return nil
}

// Shutdown stops accepting agents and public connections, lets in-flight
// requests finish until ctx is done, then closes every session and waits
// for the server's goroutines. It returns ctx's error when in-flight
// requests were cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	return s.shutdown(ctx, "edge shutting down")
}

// Drain takes the edge out of service without failing a request, for a
// rolling restart: it stops taking agents (ServeAgents' listeners close;
// hellos and binds are refused), reports itself draining (Draining) and,
// in a cluster (ID set), asks its agents to move to another edge, which
// takes their names over in one step (docs/PROTOCOL.md, Draining; a
// router.Mover), waiting for them Timeouts.Move at most. It has 256 of
// them moving at a time, asking the next as one says it moved, so that
// the other edges take thousands in turn rather than all at once; those
// not asked when Timeouts.Move passes are asked then. Then, once
// Timeouts.DrainNotice has passed, it stops as Shutdown does. It returns
// ctx's error when in-flight requests were cut short, ErrServerClosed
// when the Server was closed or drained already.
func (s *Server) Drain(ctx context.Context) error {
	s.init()
	start := time.Now()
	s.mu.Lock()
	if s.closed || s.draining {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.draining = true
	s.isDraining.Store(true)
	for ln := range s.agentLns {
		ln.Close()
	}
	s.mu.Unlock()
	s.log().Info("draining", "cluster", s.ID != "")
	s.events.Publish(view.Event{Kind: view.Drain, Time: s.now()})
	var moveLimit chan struct{} // closed once Timeouts.Move passed: nil, never
	if d := s.cfg().move; d > 0 {
		moveLimit = make(chan struct{})
		t := time.AfterFunc(d, func() { close(moveLimit) })
		defer t.Stop()
	}
	if s.ID == "" {
		s.goAway("edge draining", false)
	} else {
		s.askToMove(ctx, moveLimit)
	}
	if n := s.moves.WaitBelow(ctx, 1, moveLimit); n > 0 {
		s.log().Info("draining: agents that did not move are cut off", "sessions", n)
	}
	drain.Notice(ctx, start, s.cfg().drainNotice)
	return s.shutdown(ctx, "")
}

// Draining reports whether Drain, Shutdown or Close was called: a health
// check for a load balancer should then fail.
func (s *Server) Draining() bool {
	return s.isDraining.Load() || s.isShut.Load()
}

// shutdown stops the server as Shutdown does, telling the agents why
// (unless Drain did already).
func (s *Server) shutdown(ctx context.Context, why string) error {
	s.stopWatching()
	s.stop()
	if why != "" {
		s.goAway(why, false)
	}
	s.mu.Lock()
	servers := make([]*http.Server, 0, len(s.servers))
	for hs := range s.servers {
		servers = append(servers, hs)
	}
	s.mu.Unlock()
	var errs errorList
	for _, hs := range servers {
		if e := hs.Shutdown(ctx); e != nil {
			hs.Close()
			errs.add(e)
		}
	}
	err := errs.err()
	if err == nil { // public TLS and TCP connections, and relayed ones, finish
		err = drain.Until(ctx, func() bool { return s.connCount() == 0 })
	}
	s.closeSessions()
	s.closeConns()
	s.watcher.Close()
	s.wg.Wait()
	s.events.Close()
	s.auth.Flush()
	s.record.Stop()
	return err
}

// stop marks the server closed and closes its listeners.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		close(s.stopping)
	}
	s.closed = true
	s.wgMu.Lock() // no wg.Add once Close may wait for wg
	s.isShut.Store(true)
	s.wgMu.Unlock()
	for ln := range s.listeners {
		ln.Close()
	}
	for port, ep := range s.tcp {
		ep.ln.Close()
		delete(s.tcp, port)
	}
}

// defaultMovesInFlight is how many agents a draining edge has moving at
// once (Server.movesInFlight).
const defaultMovesInFlight = 256

// askToMove tells every agent that the edge drains and asks those that
// can to move, with at most movesInFlight of them moving at once: the next
// is asked once one of them said it moved (or its session ended). Ten
// thousand agents asked at once would open as many sessions, TLS
// handshakes and binds on the other edges within a second, which swamps
// them until their own agents miss their heartbeats. Once limit fires
// (Timeouts.Move since the drain began) or ctx ends, the rest are asked
// at once.
func (s *Server) askToMove(ctx context.Context, limit <-chan struct{}) {
	window := s.movesInFlight
	if window <= 0 {
		window = defaultMovesInFlight
	}
	paced := true
	for _, ss := range s.sessionList() {
		if paced && s.moves.WaitBelow(ctx, window, limit) >= window {
			paced = false // the limit passed: no more waiting
		}
		ss.goAway("edge draining", true)
	}
}

// goAway tells every agent that the edge is going away, and asks those of
// version wire.MoveVersion or later to move when move is set.
func (s *Server) goAway(reason string, move bool) {
	for _, ss := range s.sessionList() {
		ss.goAway(reason, move)
	}
}

// sessionList returns the sessions held now.
func (s *Server) sessionList() []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	return sessions
}

func (s *Server) closeConns() {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

func (s *Server) connCount() int {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	return len(s.conns)
}

func (s *Server) closeSessions() {
	for _, ss := range s.sessionList() {
		ss.close(s.cfg().grace)
	}
	s.pending.CloseAll()
}

func (s *Server) isClosed() bool {
	return s.isShut.Load()
}

// trackListener registers ln so that Close can stop it, or forgets it.
func (s *Server) trackListener(ln net.Listener, add bool) bool {
	return track(s, &s.listeners, ln, add)
}

// trackConn registers a public conn so that Close can end it, or forgets
// it.
func (s *Server) trackConn(c net.Conn, add bool) bool {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	if !add {
		delete(s.conns, c)
		return true
	}
	if s.isShut.Load() { // closeConns, after stop, closes the conns added before
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

// track adds v to the set *m under s.mu, unless the server is closed
// (then it reports false), or removes it.
func track[T comparable](s *Server, m *map[T]struct{}, v T, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(*m, v)
		return true
	}
	if s.closed {
		return false
	}
	if *m == nil {
		*m = map[T]struct{}{}
	}
	(*m)[v] = struct{}{}
	return true
}

// publicListener wraps the public listener of a TCP endpoint to read the
// PROXY protocol headers of the load balancers (see ProxyProtocolFrom);
// other peers' connections pass through unread.
func (s *Server) publicListener(ln net.Listener) net.Listener {
	return s.proxyListener(ln, false)
}

// clientFirstListener wraps a public listener whose clients speak first
// (HTTP, TLS) as publicListener does, and closes the connections of other
// peers that start with a PROXY signature.
func (s *Server) clientFirstListener(ln net.Listener) net.Listener {
	return s.proxyListener(ln, true)
}

// proxyListener wraps ln to read the PROXY protocol headers of the load
// balancers, when the server has some; vet closes other peers' connections
// that start with a header of their own.
func (s *Server) proxyListener(ln net.Listener, vet bool) net.Listener {
	if len(s.cfg().proxyFrom) == 0 {
		return ln
	}
	return &proxyproto.Listener{
		Listener:               ln,
		Trusted:                proxyproto.TrustPrefixes(s.cfg().proxyFrom...),
		Required:               true,
		PassUntrusted:          true,
		RejectUntrustedHeaders: vet,
		ReadTimeout:            s.cfg().handshake,
		Logger:                 s.Logger,
		Rejected: func(remote net.Addr, err error) {
			if errors.Is(err, proxyproto.ErrUntrustedHeader) {
				s.obs().Refused(ReasonProxyUntrusted)
			}
		},
	}
}

// track counts a task that Close waits for, unless the server is
// closing; s.wg.Done ends it.
func (s *Server) track() bool {
	s.wgMu.RLock()
	defer s.wgMu.RUnlock()
	if s.isShut.Load() {
		return false
	}
	s.wg.Add(1)
	return true
}

// goTracked runs f in a goroutine that Close waits for, unless the server is
// closed.
func (s *Server) goTracked(f func()) bool {
	s.wgMu.RLock()
	defer s.wgMu.RUnlock()
	if s.isShut.Load() {
		return false
	}
	s.wg.Go(f)
	return true
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// now is the time by Server.Clock.
func (s *Server) now() time.Time {
	if s.Clock != nil {
		return s.Clock()
	}
	return time.Now()
}

// resolve works out the Server's settings, and says what is wrong with
// them.
func (s *Server) resolve() (config, error) {
	t := s.Timeouts
	c := config{
		window: wire.ClampWindow(s.Limits.StreamWindow),

		handshake:         timeout(t.Handshake, DefaultHandshakeTimeout),
		heartbeatInterval: positive(t.HeartbeatInterval, wire.DefaultHeartbeatInterval),
		heartbeatTimeout:  positive(t.HeartbeatTimeout, wire.DefaultHeartbeatTimeout),
		connIdle:          timeout(t.ConnIdle, DefaultConnIdleTimeout),
		httpIdle:          timeout(t.HTTPIdle, DefaultHTTPIdleTimeout),
		responseHeader:    timeout(t.ResponseHeader, DefaultResponseHeaderTimeout),
		body:              timeout(t.Body, DefaultBodyTimeout),
		grace:             timeout(t.Grace, DefaultGrace),
		ticketLifetime:    positive(t.TicketLifetime, DefaultTicketLifetime),
		sessionTickets:    positive(t.SessionTicketLifetime, DefaultSessionTicketLifetime),
		move:              timeout(t.Move, DefaultMoveTimeout),
		drainNotice:       max(t.DrainNotice, 0),
	}
	c.setLimits(s.Limits)
	if s.StateDir != "" && s.Router == nil {
		c.restartGrace = timeout(t.RestartGrace, c.grace)
	}
	var errs errorList
	if n := len(s.TicketKey); n > 0 && n < names.MinTicketKey {
		errs.add(fmt.Errorf("TicketKey has %d bytes, want at least %d", n, names.MinTicketKey))
	}
	if r := s.TCPPorts; r != (PortRange{}) && !r.valid() {
		errs.add(fmt.Errorf("TCPPorts %d-%d: want MIN-MAX within 1-65535", r.Min, r.Max))
	}
	for _, p := range s.ProxyProtocolFrom {
		if !p.IsValid() {
			errs.add(fmt.Errorf("ProxyProtocolFrom: %q is not a valid prefix", p))
			continue
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96) // peers are matched unmapped
		}
		c.proxyFrom = append(c.proxyFrom, p.Masked())
	}
	if c.handshake == 0 {
		errs.add(errors.New("Timeouts.Handshake cannot be disabled: a peer that never speaks would hold its goroutine for good"))
	}
	if err := errs.err(); err != nil {
		return c, fmt.Errorf("edge: %w", err)
	}
	return c, nil
}

func (s *Server) obs() Observer {
	if s.Observer == nil {
		return nopObserver{}
	}
	return s.Observer
}

// tcpEndpoint is a public TCP listener the edge opened for bound routes.
type tcpEndpoint struct {
	ln   net.Listener
	refs int // bound routes on this port
}
