package edge

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// session is one agent's connection to the edge.
type session struct {
	srv *Server
	id  string
	mux muxado.Session
	log *slog.Logger

	helloDone chan struct{} // closed once the hello was accepted

	open atomic.Int64 // streams open now, both ways

	mu       sync.Mutex
	identity string
	hello    bool
	routes   map[string]Route // by tunnel ID
	closed   bool
	streams  sync.WaitGroup // stream handlers
}

// errTooManyStreams refuses a stream past Server.MaxStreamsPerSession.
var errTooManyStreams = errors.New("edge: too many streams on the agent's session")

// acquire counts one more open stream, unless the session is at its bound.
func (ss *session) acquire() bool {
	if ss.open.Add(1) > ss.srv.maxStreams() {
		ss.open.Add(-1)
		return false
	}
	return true
}

// serveSession runs one agent session until it ends, then removes its
// routes.
func (s *Server) serveSession(c net.Conn) {
	if s.AgentTLS != nil {
		// The handshake happens on the preamble's first read, bounded by
		// its deadline.
		c = tls.Server(c, s.AgentTLS)
	}
	window, err := s.preamble(c)
	if err != nil {
		s.log().Info("agent session refused", "agent_addr", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	ss := &session{
		srv:       s,
		id:        newID(),
		mux:       muxado.Server(c, wire.MuxConfig(window)),
		helloDone: make(chan struct{}),
		routes:    map[string]Route{},
	}
	ss.log = s.log().With("session", ss.id, "agent_addr", c.RemoteAddr().String())
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ss.mux.Close()
		return
	}
	if s.sessions == nil {
		s.sessions = map[string]*session{}
	}
	s.sessions[ss.id] = ss
	s.mu.Unlock()

	// An agent that does not say hello in time is dropped.
	helloTimer := time.AfterFunc(s.handshakeTimeout(), func() {
		select {
		case <-ss.helloDone:
		default:
			ss.log.Info("agent sent no hello in time")
			ss.close()
		}
	})
	defer helloTimer.Stop()

	for {
		st, err := ss.mux.AcceptStream()
		if err != nil {
			break
		}
		// Accept promptly: each stream's header is read in its own
		// goroutine, so a peer that opens a stream and stays silent
		// delays nothing else.
		if !ss.acquire() {
			st.Close()
			continue
		}
		ss.streams.Go(func() {
			defer ss.open.Add(-1)
			ss.handleStream(st)
		})
	}
	ss.close()
	ss.streams.Wait()
}

// preamble reads the agent's session preamble and answers with the stream
// window both ends will use, within the handshake timeout. Close ends it
// early: the conn is tracked meanwhile.
func (s *Server) preamble(c net.Conn) (uint32, error) {
	if !s.trackConn(c, true) {
		return 0, ErrServerClosed
	}
	defer s.trackConn(c, false)
	c.SetDeadline(time.Now().Add(s.handshakeTimeout()))
	want, err := wire.ReadPreamble(c)
	if err != nil {
		return 0, err
	}
	window := min(want, wire.ClampWindow(s.StreamWindow))
	if err := wire.WritePreamble(c, window); err != nil {
		return 0, err
	}
	return window, c.SetDeadline(time.Time{})
}

// close ends the session: its routes go at once, then the mux is closed,
// which fails every stream in flight.
func (ss *session) close() {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	routes := ss.routes
	ss.routes = nil
	counted := ss.hello
	ss.mu.Unlock()

	s := ss.srv
	s.mu.Lock()
	delete(s.sessions, ss.id)
	if counted {
		if s.perIdentity[ss.identity]--; s.perIdentity[ss.identity] <= 0 {
			delete(s.perIdentity, ss.identity)
		}
	}
	s.mu.Unlock()
	for _, r := range routes {
		s.unbind(r, s.grace())
	}
	ss.mux.Close()
	ss.log.Info("session closed", "routes", len(routes))
}

// unbind removes r from the router, keeping its name reserved for its
// identity for reserve.
func (s *Server) unbind(r Route, reserve time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.router().Unbind(ctx, r, reserve); err != nil {
		s.log().Warn("unbind", "name", r.Name, "err", err)
	}
	if r.Proto == wire.ProtoTCP {
		s.closeTCP(r.Name)
	}
}

// handleStream reads a stream's type and serves it.
func (ss *session) handleStream(st muxado.Stream) {
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(ss.srv.handshakeTimeout()))
	var t [1]byte
	if _, err := io.ReadFull(st, t[:]); err != nil {
		return
	}
	switch wire.StreamType(t[0]) {
	case wire.StreamControl:
		ss.handleControl(st)
	case wire.StreamHeartbeat:
		st.SetReadDeadline(time.Time{})
		wire.Echo(st)
	default:
		ss.log.Warn("unexpected stream type from agent", "type", t[0])
	}
}

// handleControl answers one control request.
func (ss *session) handleControl(st muxado.Stream) {
	var req wire.Request
	if err := wire.ReadMessage(st, &req); err != nil {
		ss.log.Warn("bad control message", "err", err)
		wire.WriteMessage(st, nil, wire.Response{Error: &wire.Error{Code: wire.CodeBadRequest, Message: "malformed message"}})
		// A peer that cannot frame messages cannot be trusted to go on.
		if !ss.helloSeen() {
			ss.close()
		}
		return
	}
	st.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := ss.serveRequest(ctx, &req)
	if err := wire.WriteMessage(st, nil, resp); err != nil {
		ss.log.Debug("write control response", "err", err)
	}
	if resp.Error != nil && req.Op == wire.OpHello {
		// Let the agent read why before the session goes.
		st.CloseWrite()
		time.AfterFunc(time.Second, ss.close)
	}
}

func (ss *session) helloSeen() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.hello
}

func (ss *session) serveRequest(ctx context.Context, req *wire.Request) wire.Response {
	fail := func(code, format string, args ...any) wire.Response {
		return wire.Response{Error: &wire.Error{Code: code, Message: fmt.Sprintf(format, args...)}}
	}
	if req.Op != wire.OpHello && !ss.helloSeen() {
		return fail(wire.CodeBadRequest, "hello first")
	}
	switch req.Op {
	case wire.OpHello:
		if req.Hello == nil {
			return fail(wire.CodeBadRequest, "hello without body")
		}
		return ss.serveHello(ctx, req.Hello)
	case wire.OpBind:
		if req.Bind == nil {
			return fail(wire.CodeBadRequest, "bind without body")
		}
		return ss.serveBind(ctx, req.Bind)
	case wire.OpUnbind:
		if req.Unbind == nil {
			return fail(wire.CodeBadRequest, "unbind without body")
		}
		ss.mu.Lock()
		r, ok := ss.routes[req.Unbind.TunnelID]
		delete(ss.routes, req.Unbind.TunnelID)
		ss.mu.Unlock()
		if !ok {
			return fail(wire.CodeNotFound, "no such tunnel")
		}
		ss.srv.unbind(r, 0)
		ss.log.Info("unbound", "url", ss.srv.publicURL(r))
		return wire.Response{}
	default:
		return fail(wire.CodeBadRequest, "unknown operation %q", req.Op)
	}
}

func (ss *session) serveHello(ctx context.Context, h *wire.Hello) wire.Response {
	ss.mu.Lock()
	seen := ss.hello
	ss.mu.Unlock()
	if seen {
		return wire.Response{Error: &wire.Error{Code: wire.CodeBadRequest, Message: "second hello"}}
	}
	if h.Version < 1 {
		return wire.Response{Error: &wire.Error{Code: wire.CodeVersion, Message: fmt.Sprintf("protocol version %d not supported", h.Version)}}
	}
	identity := ""
	if auth := ss.srv.Authenticate; auth != nil {
		id, err := auth(ctx, h.Token)
		if err != nil {
			ss.log.Info("agent refused", "err", err)
			return wire.Response{Error: &wire.Error{Code: wire.CodeUnauthorized, Message: "authentication failed"}}
		}
		identity = id
	}
	s := ss.srv
	s.mu.Lock()
	if limit := s.maxSessionsPerIdentity(); limit > 0 && s.perIdentity[identity] >= limit {
		s.mu.Unlock()
		ss.log.Info("agent refused: too many sessions", "identity", wire.Printable(identity, 64))
		return wire.Response{Error: &wire.Error{Code: wire.CodeUnavailable, Message: "too many sessions for this identity"}}
	}
	if s.perIdentity == nil {
		s.perIdentity = map[string]int{}
	}
	// Counted under both locks, so that close uncounts exactly once.
	ss.mu.Lock()
	ss.identity = identity
	ss.hello = !ss.closed
	if ss.hello {
		s.perIdentity[identity]++
	}
	ss.mu.Unlock()
	s.mu.Unlock()
	close(ss.helloDone)
	ss.log.Info("agent connected", "identity", identity, "agent", wire.Printable(h.Agent, 64))
	ss.srv.goTracked(ss.heartbeat)
	return wire.Response{HelloResp: &wire.HelloResp{Version: min(h.Version, wire.Version), SessionID: ss.id}}
}

func (ss *session) serveBind(ctx context.Context, b *wire.Bind) wire.Response {
	fail := func(code, msg string) wire.Response {
		return wire.Response{Error: &wire.Error{Code: code, Message: msg}}
	}
	ss.mu.Lock()
	identity := ss.identity
	ss.mu.Unlock()
	r := Route{Proto: b.Proto, SessionID: ss.id, Identity: identity, Pool: b.Pool}
	var (
		names func() (string, bool) // the next name to try, and whether to retry on ErrNameTaken
		err   error
	)
	switch b.Proto {
	case wire.ProtoHTTP, wire.ProtoTLS:
		names, err = ss.srv.hostNames(b.Name)
	case wire.ProtoTCP:
		names, err = ss.srv.tcpPorts(b.Port)
		r.Pool = r.Pool && b.Port != 0 // "any port" never joins a pool
	default:
		return fail(wire.CodeBadRequest, "unsupported protocol")
	}
	if err != nil {
		return fail(wire.CodeBadRequest, err.Error())
	}
	for {
		name, retry := names()
		if name == "" {
			return fail(wire.CodeUnavailable, "no free name or port")
		}
		r.Name, r.TunnelID = name, newID()
		if r.Proto == wire.ProtoTCP {
			// The port must be ours to listen on before it is routed.
			if err := ss.srv.openTCP(name); err != nil {
				if retry {
					continue
				}
				ss.log.Info("tcp endpoint", "port", name, "err", err)
				return fail(wire.CodeUnavailable, "port unavailable: "+name)
			}
		}
		err := ss.srv.router().Bind(ctx, r)
		if err != nil && r.Proto == wire.ProtoTCP {
			ss.srv.closeTCP(name)
		}
		if errors.Is(err, ErrNameTaken) {
			if retry {
				continue
			}
			return fail(wire.CodeNameTaken, "name taken: "+name)
		}
		if err != nil {
			ss.log.Warn("bind", "err", err)
			return fail(wire.CodeUnavailable, "bind failed")
		}
		break
	}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		ss.srv.unbind(r, 0)
		return fail(wire.CodeUnavailable, "session closed")
	}
	ss.routes[r.TunnelID] = r
	ss.mu.Unlock()
	url := ss.srv.publicURL(r)
	ss.log.Info("bound", "url", url, "pool", r.Pool)
	return wire.Response{BindResp: &wire.BindResp{TunnelID: r.TunnelID, URL: url}}
}

// heartbeat pings the agent and closes the session when it stops answering.
func (ss *session) heartbeat() {
	st, err := ss.mux.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	if _, err := st.Write([]byte{byte(wire.StreamHeartbeat)}); err != nil {
		return
	}
	hb := wire.Heartbeat{
		Interval: ss.srv.HeartbeatInterval,
		Timeout:  ss.srv.HeartbeatTimeout,
		Dead: func() {
			ss.log.Warn("agent missed its heartbeat; closing the session")
			ss.close()
		},
	}
	hb.Run(st)
}

// openProxy opens a proxy stream carrying h first.
func (ss *session) openProxy(ctx context.Context, h wire.ProxyHeader) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !ss.acquire() {
		return nil, errTooManyStreams
	}
	st, err := ss.mux.OpenStream()
	if err != nil {
		ss.open.Add(-1)
		return nil, fmt.Errorf("edge: open stream: %w", err)
	}
	c := &proxyStream{Stream: st, release: func() { ss.open.Add(-1) }}
	buf, err := wire.AppendProxyStream(nil, h)
	if err != nil {
		c.Close()
		return nil, err
	}
	// The header is the stream's first write: the agent sees the stream
	// even when the client sends nothing (a server-speaks-first protocol).
	if _, err := st.Write(buf); err != nil {
		c.Close()
		return nil, fmt.Errorf("edge: open stream: %w", err)
	}
	return c, nil
}

// proxyStream is a stream to an agent that counts against the session's
// bound until closed.
type proxyStream struct {
	muxado.Stream
	once    sync.Once
	release func()
}

func (p *proxyStream) Close() error {
	err := p.Stream.Close()
	p.once.Do(p.release)
	return err
}

// goAway tells the agent that the edge is going away: it should expect the
// session to end, and reconnect then.
func (ss *session) goAway(reason string) {
	st, err := ss.mux.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	st.SetWriteDeadline(time.Now().Add(time.Second))
	wire.WriteMessage(st, []byte{byte(wire.StreamGoAway)}, wire.GoAway{Message: reason})
}

// hostNames validates a requested HTTP or TLS name and returns the names
// to try: the name itself, under the domain, or random labels.
func (s *Server) hostNames(req string) (func() (string, bool), error) {
	domain, ok := router.Normalise(s.Domain)
	if !ok {
		return nil, errors.New("this edge serves no domain")
	}
	if req == "" {
		tries := 0
		return func() (string, bool) {
			if tries++; tries > 8 {
				return "", false
			}
			return randomName() + "." + domain, true
		}, nil
	}
	name := strings.ToLower(strings.TrimSuffix(req, "."))
	if !strings.Contains(name, ".") {
		name += "." + domain
	}
	name, ok = router.NormalisePattern(name)
	if !ok || len(name) > 253 {
		return nil, errors.New("invalid name: want DNS labels of a-z, 0-9 and '-'")
	}
	if !strings.HasSuffix(name, "."+domain) || strings.Contains(name, "_") {
		return nil, fmt.Errorf("invalid name: want a name under %s", domain)
	}
	labels := strings.Split(strings.TrimSuffix(strings.TrimPrefix(name, "*."), "."+domain), ".")
	for _, l := range labels {
		if !validLabel(l) {
			return nil, errors.New("invalid name: want DNS labels of a-z, 0-9 and '-'")
		}
	}
	done := false
	return func() (string, bool) {
		if done {
			return "", false
		}
		done = true
		return name, false
	}, nil
}

func (s *Server) publicURL(r Route) string {
	s.mu.Lock()
	httpPort, tlsPort := s.HTTPPort, s.TLSPort
	s.mu.Unlock()
	switch r.Proto {
	case wire.ProtoTCP:
		return "tcp://" + net.JoinHostPort(s.tcpURLHost(), r.Name)
	case wire.ProtoTLS:
		return "tls://" + withPort(r.Name, tlsPort, "443")
	}
	return "http://" + withPort(r.Name, httpPort, "80")
}

// withPort joins host and port, leaving out the scheme's default port.
func withPort(host, port, def string) string {
	if port == "" || port == def {
		return host
	}
	return net.JoinHostPort(host, port)
}

// validLabel reports whether s is one DNS label: 1 to 63 of a-z, 0-9 and
// '-', not starting or ending with '-'.
func validLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// randomName returns 10 random characters from a-z and 0-9.
func randomName() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 10)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
