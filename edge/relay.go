package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Relay connects the edges of a cluster: a public connection that lands on
// one edge reaches an agent held by another, over a session between the two
// edges (muxado over TLS, both sides authenticated by certificate). It is a
// Dialer: set it as Server.Dialer, and serve its listener where the other
// edges can reach it.
//
// The edge that took the public connection writes its forwarding headers
// (one hop: the client's) and names the client in the stream's header; the
// edge holding the agent copies bytes between the relay stream and a stream
// to the agent, whose header names the same client. So the app sees one
// X-Forwarded-For hop and the real client as RemoteAddr, whichever edge the
// client reached. Each edge keeps one session to each peer it sends
// connections to, opened on first use and again after it breaks.
type Relay struct {
	// Server is this edge. Routes whose Edge is its ID, or empty, are
	// dialled on it directly.
	Server *Server

	// TLSConfig authenticates edges to each other, both ways: its
	// Certificates are this edge's, its RootCAs and ClientCAs the
	// authority that signs the cluster's edges. Serve requires and
	// verifies the client's certificate whatever ClientAuth says.
	// Required.
	TLSConfig *tls.Config

	// Resolve returns the address of the relay listener of the edge with
	// ID id. Nil: the ID is the address ("10.0.0.2:7443").
	Resolve func(ctx context.Context, id string) (addr string, err error)

	// Logger receives the relay's logs. Nil: the Server's.
	Logger *slog.Logger

	mu        sync.Mutex
	closed    bool
	peers     map[string]*peer
	listeners map[net.Listener]struct{}
	sessions  map[*wire.Session]struct{} // accepted from peers
	wg        sync.WaitGroup
}

// peer is the session to one other edge, dialled on first use.
type peer struct {
	mu   sync.Mutex // held while dialling
	sess *wire.Session
}

// relayBacklog is how many relay streams a peer may have opened and not
// yet had accepted: each carries a public connection, which come in
// bursts.
const relayBacklog = 1024

// ErrRelayClosed is returned by a Relay's methods after Close.
var ErrRelayClosed = errors.New("edge: relay closed")

func (rl *Relay) log() *slog.Logger {
	if rl.Logger != nil {
		return rl.Logger
	}
	return rl.Server.log()
}

// DialRoute opens the conn to r's agent: on this edge when it holds the
// route, else through a relay stream to the edge that does.
func (rl *Relay) DialRoute(ctx context.Context, r router.Route, c ConnInfo) (net.Conn, error) {
	if r.Edge == "" || r.Edge == rl.Server.ID {
		return rl.Server.DialRoute(ctx, r, c)
	}
	h := wire.ProxyHeader{TunnelID: r.TunnelID, Proto: r.Proto, Client: c.Client, Host: c.Host}
	head, err := wire.AppendRelayStream(nil, r.SessionID, h)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		sess, err := rl.session(ctx, r.Edge)
		if err != nil {
			return nil, fmt.Errorf("%w: edge %q: %w", ErrNoSession, r.Edge, err)
		}
		st, err := sess.OpenStream()
		if err == nil {
			if _, err = st.Write(head); err == nil {
				return &relayStream{Stream: st}, nil
			}
			st.Close()
		}
		// The session broke: forget it, and try once on a new one.
		rl.drop(r.Edge, sess)
		if attempt > 0 || ctx.Err() != nil {
			return nil, fmt.Errorf("%w: edge %q: %w", ErrNoSession, r.Edge, err)
		}
	}
}

// session returns the session to the edge id, dialling it if needed.
func (rl *Relay) session(ctx context.Context, id string) (*wire.Session, error) {
	rl.Server.init()
	rl.mu.Lock()
	if rl.closed {
		rl.mu.Unlock()
		return nil, ErrRelayClosed
	}
	if rl.peers == nil {
		rl.peers = map[string]*peer{}
	}
	p := rl.peers[id]
	if p == nil {
		p = &peer{}
		rl.peers[id] = p
	}
	rl.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess != nil {
		return p.sess, nil
	}
	addr := id
	if rl.Resolve != nil {
		var err error
		if addr, err = rl.Resolve(ctx, id); err != nil {
			return nil, err
		}
	}
	if rl.TLSConfig == nil {
		return nil, errors.New("edge: Relay.TLSConfig is required")
	}
	cfg := rl.TLSConfig.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: rl.Server.cfg.handshake, KeepAlive: 15 * time.Second}, Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	sess := wire.NewSession(conn, rl.Server.cfg.window, true, 0)
	p.sess = sess
	rl.log().Info("relay session opened", "edge", id, "addr", addr)
	if !rl.goTracked(func() {
		sess.Wait()
		rl.drop(id, sess)
		rl.log().Info("relay session closed", "edge", id, "addr", addr)
	}) {
		sess.Close()
		p.sess = nil
		return nil, ErrRelayClosed
	}
	return sess, nil
}

// drop forgets a broken session to the edge id.
func (rl *Relay) drop(id string, sess *wire.Session) {
	rl.mu.Lock()
	p := rl.peers[id]
	rl.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.sess == sess {
		p.sess = nil
	}
	p.mu.Unlock()
	sess.Close()
}

// Serve accepts relay sessions from other edges on ln until ln fails or the
// relay is closed, then returns an error (wrapping net.ErrClosed after
// Close).
func (rl *Relay) Serve(ln net.Listener) error {
	rl.Server.init()
	if rl.TLSConfig == nil {
		ln.Close()
		return errors.New("edge: Relay.TLSConfig is required")
	}
	cfg := rl.TLSConfig.Clone()
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	rl.mu.Lock()
	if rl.closed {
		rl.mu.Unlock()
		ln.Close()
		return fmt.Errorf("edge: %w", net.ErrClosed)
	}
	if rl.listeners == nil {
		rl.listeners = map[net.Listener]struct{}{}
	}
	rl.listeners[ln] = struct{}{}
	rl.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			rl.mu.Lock()
			closed := rl.closed
			delete(rl.listeners, ln)
			rl.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("edge: %w", net.ErrClosed)
			}
			return err
		}
		if !rl.goTracked(func() { rl.serveSession(c, cfg) }) {
			c.Close()
		}
	}
}

// goTracked runs f in a goroutine that Close waits for, unless the relay
// is closed.
func (rl *Relay) goTracked(f func()) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.closed {
		return false
	}
	rl.wg.Go(f)
	return true
}

// serveSession authenticates a peer edge and serves its relay streams.
func (rl *Relay) serveSession(c net.Conn, cfg *tls.Config) {
	tc := tls.Server(c, cfg)
	tc.SetDeadline(time.Now().Add(rl.Server.cfg.handshake))
	if err := tc.Handshake(); err != nil {
		rl.log().Info("relay handshake", "peer", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	tc.SetDeadline(time.Time{})
	sess := wire.NewSession(tc, rl.Server.cfg.window, false, relayBacklog)
	rl.mu.Lock()
	if rl.closed {
		rl.mu.Unlock()
		sess.Close()
		return
	}
	if rl.sessions == nil {
		rl.sessions = map[*wire.Session]struct{}{}
	}
	rl.sessions[sess] = struct{}{}
	rl.mu.Unlock()
	defer func() {
		rl.mu.Lock()
		delete(rl.sessions, sess)
		rl.mu.Unlock()
		sess.Close()
	}()
	peerName := tc.ConnectionState().PeerCertificates[0].Subject.CommonName
	rl.log().Info("relay session accepted", "peer", c.RemoteAddr().String(), "name", peerName)
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		if !rl.goTracked(func() { rl.serveStream(st) }) {
			st.Close()
			return
		}
	}
}

// serveStream connects a relay stream to the agent it names, on this edge.
func (rl *Relay) serveStream(st *wire.Stream) {
	defer st.Close()
	s := rl.Server
	st.SetReadDeadline(time.Now().Add(s.cfg.handshake))
	session, h, err := wire.ReadRelayHeader(st)
	if err != nil {
		rl.log().Debug("relay stream header", "err", err)
		return
	}
	st.SetReadDeadline(time.Time{})
	r := router.Route{Proto: h.Proto, SessionID: session, TunnelID: h.TunnelID}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.handshake)
	up, err := s.dialRaw(ctx, r, ConnInfo{Client: h.Client, Host: h.Host})
	cancel()
	if err != nil {
		// The other edge hears it as a stream ending before the agent's
		// reply, and tries the route's other agents.
		rl.log().Info("relay: agent unreachable", "session", wire.Printable(session, 64), "err", err)
		return
	}
	if !s.trackConn(up, true) {
		up.Close()
		return
	}
	defer s.trackConn(up, false)
	pipe.JoinStreams(st, up, s.cfg.connIdle)
}

// Close closes the relay's listeners and sessions, and waits for its
// goroutines. It is safe to call more than once.
func (rl *Relay) Close() error {
	rl.mu.Lock()
	rl.closed = true
	for ln := range rl.listeners {
		ln.Close()
	}
	for sess := range rl.sessions {
		sess.Close()
	}
	peers := rl.peers
	rl.peers = nil
	rl.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		if p.sess != nil {
			p.sess.Close()
		}
		p.mu.Unlock()
	}
	rl.wg.Wait()
	return nil
}

// relayStream is a stream to another edge for a route it holds: reads
// first read the agent's reply, which comes through untouched.
type relayStream struct {
	*wire.Stream
	verdict reply
}

func (c *relayStream) Read(b []byte) (int, error) {
	if err := c.verdict.read(c.Stream); err != nil {
		return 0, err
	}
	return c.Stream.Read(b)
}
