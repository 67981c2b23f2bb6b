package edge

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Server is an edge: it accepts agent sessions and routes public traffic to
// them. Its zero value with a Domain set is ready to use, with an in-memory
// router. A Server must not be copied after first use.
type Server struct {
	// Domain is the domain HTTP endpoints live under: an agent that binds
	// the name "abc" is reached at abc.<Domain>. Required for HTTP.
	Domain string

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

	// Router decides where public traffic goes. Nil: a MemoryRouter.
	Router Router

	// Dialer opens the conn to a route's agent. Nil: the Server itself,
	// which opens a stream on the agent's session (see DialRoute).
	Dialer Dialer

	// Authenticate checks the token an agent presents in its hello and
	// returns the agent's identity, which owns the names it binds. Nil:
	// every agent is accepted with the empty identity: names are first
	// come, first served, and any agent may join a pool.
	Authenticate func(ctx context.Context, token string) (identity string, err error)

	// AgentTLS, if set, makes ServeAgents speak TLS with this
	// configuration to every agent. Nil: the listener's conns are used as
	// they are (plaintext, or TLS the caller set up).
	AgentTLS *tls.Config

	// MaxSessionsPerIdentity bounds the sessions one identity holds at
	// once: a hello past it is refused. Zero: 1024; negative: no bound.
	MaxSessionsPerIdentity int

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
	// either way for that long, and an idle public HTTP keep-alive
	// connection. Zero: 10 minutes for TLS and TCP, 2 minutes for HTTP;
	// negative: never.
	IdleTimeout time.Duration

	// ResponseHeaderTimeout bounds how long the edge waits for an agent's
	// app to start answering an HTTP request; past it the client gets 502.
	// Zero: 5 minutes (long polls fit); negative: no bound.
	ResponseHeaderTimeout time.Duration

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

	initOnce sync.Once
	mem      *MemoryRouter
	proxy    *httpProxy

	mu          sync.Mutex
	closed      bool
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
		s.mem = new(MemoryRouter)
		s.proxy = newHTTPProxy(s)
	})
}

func (s *Server) router() Router {
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
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.handshakeTimeout(),
		IdleTimeout:       s.idleTimeout(2 * time.Minute),
		ErrorLog:          slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
	}
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

// Close closes every listener, public HTTP connection and agent session at
// once, and waits for the server's goroutines. It is safe to call more than
// once.
func (s *Server) Close() error {
	s.stop()
	s.mu.Lock()
	for hs := range s.servers {
		hs.Close()
	}
	s.mu.Unlock()
	s.closeSessions()
	s.closeConns()
	s.wg.Wait()
	if s.proxy != nil {
		s.proxy.transport.CloseIdleConnections()
	}
	return nil
}

// Shutdown stops accepting agents and public connections, lets in-flight
// requests finish until ctx is done, then closes every session and waits
// for the server's goroutines. It returns ctx's error when in-flight
// requests were cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	s.goAway()
	s.mu.Lock()
	servers := make([]*http.Server, 0, len(s.servers))
	for hs := range s.servers {
		servers = append(servers, hs)
	}
	s.mu.Unlock()
	var err error
	for _, hs := range servers {
		if e := hs.Shutdown(ctx); e != nil {
			hs.Close()
			err = e
		}
	}
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
	if s.proxy != nil {
		s.proxy.transport.CloseIdleConnections()
	}
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
		ss.close()
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

// Dialer opens the conn that carries one public connection to the agent of
// a route. The edge writes nothing to the returned conn before the client's
// bytes and owns it afterwards (it closes it).
type Dialer interface {
	DialRoute(ctx context.Context, r Route, c ConnInfo) (net.Conn, error)
}

// ConnInfo describes a public connection.
type ConnInfo struct {
	Client netip.AddrPort // the public client's address
	Host   string         // the HTTP Host or TLS server name
}

// DialRoute opens a stream to r's agent on the session this server holds,
// starting with the proxy header that tells the agent who the client is. It
// is the default Dialer; a custom Dialer can call it for local routes.
func (s *Server) DialRoute(ctx context.Context, r Route, c ConnInfo) (net.Conn, error) {
	if r.Edge != "" {
		return nil, fmt.Errorf("%w: route held by edge %q", ErrNoSession, r.Edge)
	}
	s.mu.Lock()
	ss := s.sessions[r.SessionID]
	s.mu.Unlock()
	if ss == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoSession, r.SessionID)
	}
	return ss.openProxy(ctx, wire.ProxyHeader{
		TunnelID: r.TunnelID,
		Proto:    r.Proto,
		Client:   c.Client,
		Host:     c.Host,
	})
}

// dialRoutes dials the first reachable route of routes, reporting failures
// to the router so later lookups try those routes last.
func (s *Server) dialRoutes(ctx context.Context, routes []Route, c ConnInfo) (net.Conn, Route, error) {
	var errs []error
	for _, r := range routes {
		conn, err := s.dialer().DialRoute(ctx, r, c)
		if err == nil {
			return conn, r, nil
		}
		errs = append(errs, err)
		if fr, ok := s.router().(failReporter); ok {
			fr.Fail(r)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, Route{}, errNoRoute
	}
	return nil, Route{}, errors.Join(errs...)
}

var errNoRoute = errors.New("edge: no route")

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
