package edge

import (
	"container/list"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
	"github.com/tunnelkit/tunnelkit/router"
)

// Server is an edge: it accepts agent sessions and routes public traffic to
// them. Its zero value with a Domain set is ready to use, with an in-memory
// router. A Server must not be copied after first use.
type Server struct {
	// Domain is the domain HTTP endpoints live under: an agent that binds
	// the name "abc" is reached at abc.<Domain>. Required for HTTP.
	Domain string

	// ID names this edge in a cluster of edges sharing one Router: it is
	// stamped on the routes it binds (router.Route.Edge), so that the others know
	// which edge holds the agent (see Relay). Empty: a lone edge.
	ID string

	// HTTPPort is the port written into public HTTP URLs handed to agents.
	// Empty: the port of the first listener given to ServeHTTPListener, or
	// none (port 80) when the server is only used as an http.Handler.
	HTTPPort string

	// TLSPort is the port written into public TLS URLs. Empty: the port of
	// the first listener given to ServeSNI.
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
	// on demand (see ACME).
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
	// through crypto/tls, with the same keys. A connection whose ECH does
	// not decrypt (a stale configuration) goes by its outer name; when
	// that is the public name of one of the keys and no endpoint has it,
	// the edge completes the handshake for it with its own certificate
	// (Certificates, GetCertificate) and sends the keys marked
	// SendAsRetry as retry configurations, so the client tries again with
	// them. Make keys with sni.NewECHKey (sni.MarshalECHKeyPEM and
	// sni.ParseECHKeyPEM for files).
	ECHKeys []tls.EncryptedClientHelloKey

	// RedirectHTTP answers a plain-HTTP request for a name bound over
	// https only with 308 Permanent Redirect to its https URL. False: 404
	// with the code https_only.
	RedirectHTTP bool

	// AccessLog, if set, gets one line per public HTTP request: method,
	// host, path, protocol, status, bytes, duration and client. Nil: none.
	AccessLog *slog.Logger

	// NotTLS receives the connections on ServeSNI listeners that are not
	// TLS, with every byte read so far replayed, and owns them. Nil: they
	// are closed.
	NotTLS func(net.Conn)

	// ProxyProtocol makes the public listeners (ServeHTTPListener, ServeSNI
	// and TCP endpoints) expect a PROXY protocol header, version 1 or 2, at
	// the start of every connection, as a load balancer in front of the
	// edge sends: the header's source is then the client's address. A
	// connection without a valid header is closed.
	ProxyProtocol bool

	// Router decides where public traffic goes. Nil: a router.MemoryRouter.
	Router router.Router

	// Dialer opens the conn to a route's agent. Nil: the Server itself,
	// which opens a stream on the agent's session (see DialRoute).
	Dialer Dialer

	// Authenticate checks the token an agent presents in its hello and
	// returns the agent's identity, which owns the names it binds (see
	// router.Router for the rules). Nil: every agent is accepted, and each is an
	// identity of its own ("anonymous-" and random hex), which it keeps
	// across reconnections through its session ticket; agents can then not
	// share a pool.
	Authenticate func(ctx context.Context, token string) (identity string, err error)

	// MaxAuthFailures is how many failed hellos (a refused token) one
	// source address (an IPv6 /64) may have per minute, with a burst as
	// large. Past it, the source's agent connections are closed as soon as
	// they are accepted, until a minute's share has passed; failures are
	// logged in aggregate, one line per 10 s. Zero: 10; negative: no limit.
	MaxAuthFailures int

	// TicketKey signs the tickets the edge gives agents (at least 32
	// bytes; ServeAgents fails with a shorter one). A session ticket lets a
	// reconnecting agent take over its previous session's endpoints at
	// once; endpoint tickets prove, after a restart, which identity held a
	// name. Keep the key secret, and the same across restarts of an edge
	// and across the edges of a cluster: a ticket signed under another key
	// is ignored. Nil: a random key per Server, so that tickets do not
	// survive a restart.
	TicketKey []byte

	// TicketLifetime is how long an endpoint ticket proves its name; agents
	// renew theirs at half of it. Zero: 1 hour.
	TicketLifetime time.Duration

	// RestartGrace is how long after the Server starts a name or port an
	// agent chooses is granted only with an endpoint ticket showing that
	// its identity held it before: after a restart, names go back to their
	// owners, never to whoever asks first. Random names and ports are
	// granted meanwhile. Zero: Grace when TicketKey is set and router.Router is
	// nil (an in-memory router forgets every name on a restart), else
	// none; negative: none.
	RestartGrace time.Duration

	// AllowCatchAll lets agents bind "*" and "*.<Domain>": a wildcard
	// over every name under the domain, which makes its owner the owner of
	// every name (see router.Router). Leave it off on a multi-tenant edge.
	AllowCatchAll bool

	// AgentTLS, if set, makes ServeAgents speak TLS with this
	// configuration to every agent. Nil: the listener's conns are used as
	// they are (plaintext, or TLS the caller set up).
	AgentTLS *tls.Config

	// MaxSessionsPerIdentity bounds the sessions one identity holds at
	// once: a hello past it is refused. Zero: 1024; negative: no bound.
	MaxSessionsPerIdentity int

	// MaxPendingSessions bounds the agent connections that have not had
	// their hello accepted yet: past it, the one waiting longest is closed.
	// Each costs a goroutine and its buffers, for at most
	// HandshakeTimeout. Zero: 1024; negative: no bound.
	MaxPendingSessions int

	// MaxEndpointsPerSession bounds the endpoints one agent session holds
	// at once: a bind past it is refused as unavailable. Zero: 1024;
	// negative: no bound.
	MaxEndpointsPerSession int

	// MaxStreamsPerSession bounds the streams open at once on one agent
	// session, public connections and the agent's requests together: past
	// it, a public connection goes to another agent of the endpoint or is
	// refused, and a stream the agent opens is closed at once. Each stream
	// buffers at most a window (256 KiB) of unread bytes. Zero: 4096.
	MaxStreamsPerSession int

	// StreamWindow is the most unread bytes each stream of an agent
	// session buffers, at both ends: an agent asking for more gets this
	// much. Zero: 256 KiB; it is kept within 64 KiB and 16 MiB.
	StreamWindow int

	// IdleTimeout closes a public TLS or TCP connection that moved no byte
	// either way for that long, an idle public HTTP keep-alive connection,
	// and an HTTP exchange whose response, or upgraded connection (a
	// WebSocket), moved no byte for that long once the app answered. Zero:
	// 10 minutes for TLS and TCP, 2 minutes for HTTP; negative: never.
	IdleTimeout time.Duration

	// ResponseHeaderTimeout bounds how long the edge waits for an agent's
	// app to start answering an HTTP request; past it the client gets 504.
	// Zero: 5 minutes (long polls fit); negative: no bound.
	ResponseHeaderTimeout time.Duration

	// BodyTimeout bounds the wait for each read of a public HTTP request's
	// body, as nginx's client_body_timeout does: a body that stops moving
	// for that long is cut off and the client gets 408. Zero: 60 s;
	// negative: no bound.
	BodyTimeout time.Duration

	// ClientShare is the part of one endpoint's streams (the agents'
	// MaxStreamsPerSession, summed over its pool) that the connections and
	// requests of one public client address (an IPv6 /64) may hold at
	// once: 256 of 4096 by default. Past it, that client's new connections
	// are closed and its requests answered 429, while everyone else is
	// served. It bounds what one address takes; many addresses together
	// can still fill a session (a flood from many hosts is for the network
	// in front of the edge to stop). Zero: 1/16; negative or 1 and more: no
	// bound.
	ClientShare float64

	// Grace is how long the names of an agent session that ended stay
	// reserved for its identity, so that the agent, reconnecting, gets its
	// URLs back and nobody else can take them meanwhile. Zero: 30 s;
	// negative: names are free at once. Names an agent unbinds itself are
	// free at once.
	Grace time.Duration

	// HandshakeTimeout bounds the time an agent has to send its hello, and
	// any peer to send a stream's header. Zero: 10 s.
	HandshakeTimeout time.Duration

	// HeartbeatInterval and HeartbeatTimeout set how often the edge pings
	// each agent and how long it waits for an answer before it closes the
	// session. Zero: 10 s and 15 s.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration

	// Logger receives the server's logs. Nil: they are discarded.
	Logger *slog.Logger

	// Observer, if set, hears what happens on the edge, to count it (see
	// Observer). Nil: nothing is counted.
	Observer Observer

	initOnce sync.Once
	mem      *router.MemoryRouter
	proxy    *httpProxy
	signer   ticketSigner
	started  time.Time
	auth     *authGuard
	shares   shares
	streams  idleStreams
	term     terminating
	ech      echState

	watchOnce sync.Once
	stopWatch func() // stops watching a shared Router's routes

	mu          sync.Mutex
	closed      bool
	pending     list.List // agent conns waiting for their hello
	evicted     int       // pending conns closed to make room
	sessions    map[string]*session
	perIdentity map[string]int // sessions that said hello, by identity
	listeners   map[net.Listener]struct{}
	servers     map[*http.Server]struct{}
	tcp         map[string]*tcpEndpoint // by port
	conns       map[net.Conn]struct{}   // public TLS and TCP conns, and their streams
	wg          sync.WaitGroup          // session and listener goroutines
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.started = time.Now()
		s.mem = new(router.MemoryRouter)
		s.proxy = newHTTPProxy(s)
		s.signer.key = s.TicketKey
		if len(s.signer.key) == 0 {
			s.signer.key = make([]byte, minTicketKey)
			rand.Read(s.signer.key)
		}
		if s.MaxAuthFailures >= 0 {
			n := s.MaxAuthFailures
			if n == 0 {
				n = defaultMaxAuthFailures
			}
			s.auth = &authGuard{perMinute: n, log: s.log()}
		}
	})
}

func (s *Server) tickets() ticketSigner {
	s.init()
	return s.signer
}

func (s *Server) ticketLifetime() time.Duration {
	if s.TicketLifetime > 0 {
		return s.TicketLifetime
	}
	return time.Hour
}

// restarting reports whether the server is within its RestartGrace, and
// until when.
func (s *Server) restarting() (time.Time, bool) {
	g := s.RestartGrace
	switch {
	case g < 0:
		return time.Time{}, false
	case g == 0 && len(s.TicketKey) > 0 && s.Router == nil:
		g = s.grace()
	case g == 0:
		return time.Time{}, false
	}
	s.init()
	until := s.started.Add(g)
	return until, time.Now().Before(until)
}

func (s *Server) router() router.Router {
	if s.Router != nil {
		return s.Router
	}
	s.init()
	return s.mem
}

func (s *Server) dialer() Dialer {
	if s.Dialer != nil {
		return s.Dialer
	}
	return s
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return discard
	}
	return s.Logger
}

var discard = slog.New(slog.DiscardHandler)

// idleTimeout returns IdleTimeout, or def when it is zero; zero when
// negative (never).
func (s *Server) idleTimeout(def time.Duration) time.Duration {
	switch {
	case s.IdleTimeout < 0:
		return 0
	case s.IdleTimeout == 0:
		return def
	}
	return s.IdleTimeout
}

func (s *Server) maxSessionsPerIdentity() int {
	switch {
	case s.MaxSessionsPerIdentity < 0:
		return 0
	case s.MaxSessionsPerIdentity == 0:
		return 1024
	}
	return s.MaxSessionsPerIdentity
}

func (s *Server) maxStreams() int64 {
	if s.MaxStreamsPerSession > 0 {
		return int64(s.MaxStreamsPerSession)
	}
	return 4096
}

func (s *Server) grace() time.Duration {
	switch {
	case s.Grace < 0:
		return 0
	case s.Grace == 0:
		return 30 * time.Second
	}
	return s.Grace
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return 10 * time.Second
}

// ServeAgents accepts agent sessions on ln until ln fails or the server is
// closed, then returns an error (wrapping net.ErrClosed after Close or
// Shutdown).
func (s *Server) ServeAgents(ln net.Listener) error {
	if n := len(s.TicketKey); n > 0 && n < minTicketKey {
		ln.Close()
		return fmt.Errorf("edge: TicketKey has %d bytes, want at least %d", n, minTicketKey)
	}
	s.watchRoutes()
	return s.serve(ln, "agents", s.serveSession)
}

// serve accepts conns on ln until ln fails or the server is closed, and
// runs handle for each in a goroutine that Close waits for. It backs off
// on temporary errors (out of file descriptors), and returns an error
// wrapping net.ErrClosed after Close or Shutdown.
func (s *Server) serve(ln net.Listener, what string, handle func(net.Conn)) error {
	s.init()
	if !s.trackListener(ln, true) {
		ln.Close()
		return fmt.Errorf("edge: %w", net.ErrClosed)
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
				return fmt.Errorf("edge: %w", net.ErrClosed)
			}
			return err
		}
		delay = 0
		if !s.goTracked(func() { handle(c) }) {
			c.Close()
		}
	}
}

// ServeHTTPListener serves public HTTP on ln until the server is shut down.
// It returns an error wrapping net.ErrClosed after Close or Shutdown.
func (s *Server) ServeHTTPListener(ln net.Listener) error {
	s.init()
	hs := s.newHTTPServer(s, "http")
	// HTTP/2 without TLS, for clients that know the edge speaks it (prior
	// knowledge), beside HTTP/1.1.
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs.Protocols = p
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return fmt.Errorf("edge: %w", net.ErrClosed)
	}
	if s.HTTPPort == "" {
		if _, port, err := net.SplitHostPort(ln.Addr().String()); err == nil {
			s.HTTPPort = port
		}
	}
	if s.servers == nil {
		s.servers = map[*http.Server]struct{}{}
	}
	s.servers[hs] = struct{}{}
	s.mu.Unlock()
	err := hs.Serve(s.publicListener(ln))
	if errors.Is(err, http.ErrServerClosed) {
		err = fmt.Errorf("edge: %w", net.ErrClosed)
	}
	return err
}

// newHTTPServer returns an http.Server for public HTTP connections of
// proto (http, or https for TLS the edge terminated).
func (s *Server) newHTTPServer(h http.Handler, proto string) *http.Server {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.handshakeTimeout(),
		IdleTimeout:       s.idleTimeout(2 * time.Minute),
		ErrorLog:          slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
	}
	s.trackClients(hs, proto)
	return hs
}

// Close closes every listener, public HTTP connection and agent session at
// once, and waits for the server's goroutines. It is safe to call more than
// once.
func (s *Server) Close() error {
	s.stopWatching()
	s.stop()
	s.mu.Lock()
	for hs := range s.servers {
		hs.Close()
	}
	s.mu.Unlock()
	s.closeSessions()
	s.closeConns()
	s.wg.Wait()
	s.auth.flush()
	return nil
}

// Shutdown stops accepting agents and public connections, lets in-flight
// requests finish until ctx is done, then closes every session and waits
// for the server's goroutines. It returns ctx's error when in-flight
// requests were cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopWatching()
	s.stop()
	s.goAway()
	s.mu.Lock()
	servers := make([]*http.Server, 0, len(s.servers))
	for hs := range s.servers {
		servers = append(servers, hs)
	}
	s.mu.Unlock()
	var errs *multierror.Error
	for _, hs := range servers {
		if e := hs.Shutdown(ctx); e != nil {
			hs.Close()
			errs = multierror.Append(errs, e)
		}
	}
	err := errs.ErrorOrNil()
	// Let public TLS and TCP connections finish until ctx is done.
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.connCount() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-t.C:
		}
	}
	s.closeSessions()
	s.closeConns()
	s.wg.Wait()
	s.auth.flush()
	return err
}

// stop marks the server closed and closes its listeners.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	for port, ep := range s.tcp {
		ep.ln.Close()
		delete(s.tcp, port)
	}
}

// goAway tells every agent that the edge is going away.
func (s *Server) goAway() {
	for _, ss := range s.sessionList() {
		ss.goAway("edge shutting down")
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
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

func (s *Server) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) closeSessions() {
	for _, ss := range s.sessionList() {
		ss.close(s.grace())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for e := s.pending.Front(); e != nil; e = e.Next() {
		e.Value.(net.Conn).Close()
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// trackListener registers ln so that Close can stop it, or forgets it.
func (s *Server) trackListener(ln net.Listener, add bool) bool {
	return track(s, &s.listeners, ln, add)
}

// trackConn registers a public conn so that Close can end it, or forgets
// it.
func (s *Server) trackConn(c net.Conn, add bool) bool {
	return track(s, &s.conns, c, add)
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

// publicListener wraps a public listener to read PROXY protocol headers
// when the server expects them.
func (s *Server) publicListener(ln net.Listener) net.Listener {
	if !s.ProxyProtocol {
		return ln
	}
	return &proxyproto.Listener{Listener: ln, Required: true, ReadTimeout: s.handshakeTimeout(), Logger: s.Logger}
}

// goTracked runs f in a goroutine that Close waits for, unless the server is
// closed.
func (s *Server) goTracked(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
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
