package edge

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
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

	mu       sync.Mutex
	identity string
	hello    bool
	routes   map[string]Route // by tunnel ID
	closed   bool
	streams  sync.WaitGroup // stream handlers
}

// serveSession runs one agent session until it ends, then removes its
// routes.
func (s *Server) serveSession(c net.Conn) {
	ss := &session{
		srv:       s,
		id:        newID(),
		mux:       muxado.Server(c, muxConfig()),
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
		ss.streams.Go(func() { ss.handleStream(st) })
	}
	ss.close()
	ss.streams.Wait()
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
	ss.mu.Unlock()

	s := ss.srv
	s.mu.Lock()
	delete(s.sessions, ss.id)
	s.mu.Unlock()
	for _, r := range routes {
		s.unbind(r)
	}
	ss.mux.Close()
	ss.log.Info("session closed", "routes", len(routes))
}

func (s *Server) unbind(r Route) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.router().Unbind(ctx, r); err != nil {
		s.log().Warn("unbind", "name", r.Name, "err", err)
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
		ss.srv.unbind(r)
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
	identity := ss.id
	if auth := ss.srv.Authenticate; auth != nil {
		id, err := auth(ctx, h.Token)
		if err != nil {
			ss.log.Info("agent refused", "err", err)
			return wire.Response{Error: &wire.Error{Code: wire.CodeUnauthorized, Message: "authentication failed"}}
		}
		identity = id
	}
	ss.mu.Lock()
	ss.identity = identity
	ss.hello = true
	ss.mu.Unlock()
	close(ss.helloDone)
	ss.log.Info("agent connected", "identity", identity, "agent", printable(h.Agent))
	ss.srv.goTracked(ss.heartbeat)
	return wire.Response{HelloResp: &wire.HelloResp{Version: min(h.Version, wire.Version), SessionID: ss.id}}
}

func (ss *session) serveBind(ctx context.Context, b *wire.Bind) wire.Response {
	fail := func(code, msg string) wire.Response {
		return wire.Response{Error: &wire.Error{Code: code, Message: msg}}
	}
	if b.Proto != wire.ProtoHTTP {
		return fail(wire.CodeBadRequest, "unsupported protocol")
	}
	if ss.srv.Domain == "" {
		return fail(wire.CodeUnavailable, "this edge serves no HTTP domain")
	}
	name := strings.ToLower(b.Name)
	random := name == ""
	if !random && !validLabel(name) {
		return fail(wire.CodeBadRequest, "invalid name: want a DNS label (a-z, 0-9, '-', at most 63)")
	}
	ss.mu.Lock()
	identity := ss.identity
	ss.mu.Unlock()
	for try := 0; ; try++ {
		if random {
			name = randomName()
		}
		host, ok := router.Normalise(name + "." + ss.srv.Domain)
		if !ok {
			return fail(wire.CodeBadRequest, "invalid name")
		}
		r := Route{Proto: wire.ProtoHTTP, Name: host, TunnelID: newID(), SessionID: ss.id, Identity: identity}
		err := ss.srv.router().Bind(ctx, r)
		if errors.Is(err, ErrNameTaken) {
			if random && try < 8 {
				continue
			}
			return fail(wire.CodeNameTaken, "name taken: "+host)
		}
		if err != nil {
			ss.log.Warn("bind", "err", err)
			return fail(wire.CodeUnavailable, "bind failed")
		}
		ss.mu.Lock()
		if ss.closed {
			ss.mu.Unlock()
			ss.srv.unbind(r)
			return fail(wire.CodeUnavailable, "session closed")
		}
		ss.routes[r.TunnelID] = r
		ss.mu.Unlock()
		url := ss.srv.publicURL(r)
		ss.log.Info("bound", "url", url)
		return wire.Response{BindResp: &wire.BindResp{TunnelID: r.TunnelID, URL: url}}
	}
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
	st, err := ss.mux.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("edge: open stream: %w", err)
	}
	buf, err := wire.AppendProxyStream(nil, h)
	if err != nil {
		st.Close()
		return nil, err
	}
	// The header is the stream's first write: the agent sees the stream
	// even when the client sends nothing (a server-speaks-first protocol).
	if _, err := st.Write(buf); err != nil {
		st.Close()
		return nil, fmt.Errorf("edge: open stream: %w", err)
	}
	return st, nil
}

func (s *Server) publicURL(r Route) string {
	host := r.Name
	if s.HTTPPort != "" && s.HTTPPort != "80" {
		host = net.JoinHostPort(host, s.HTTPPort)
	}
	return "http://" + host
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

// printable returns s with anything but printable ASCII replaced, so a
// client's string cannot forge log lines.
func printable(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}
