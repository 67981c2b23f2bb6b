// Package relay connects the edges of a cluster (see Relay).
package relay

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Relay connects the edges of a cluster: a public connection that lands on
// one edge reaches an agent held by another, over a session between the two
// edges (muxado over TLS, both sides authenticated by certificate). It is a
// edge.Dialer: set it as the Server's Dialer, and serve its listener
// where the other edges can reach it.
//
// The edge that took the public connection writes its forwarding headers
// (one hop: the client's) and names the client in the stream's header; the
// edge holding the agent copies bytes between the relay stream and a stream
// to the agent, whose header names the same client. So the app sees one
// X-Forwarded-For hop and the real client as RemoteAddr, whichever edge the
// client reached. Each edge keeps one session to each peer it sends
// connections to, opened on first use and again after it breaks.
//
// Edges authenticate each other by certificate, both ways, and only a
// member of the cluster opens a relay session. An edge's relay
// certificate is signed by the cluster's CA (TLSConfig) and names the
// edge: its ID in a subject alternative name of type URI,
// tunnelkit-edge://<ID> (see PeerURI), with the extended key usages
// serverAuth and clientAuth; and, as any TLS server's, the host it is
// dialled at (Resolve) in a DNS or IP SAN. Serve admits a peer only if
// its certificate names an edge (PeerIDs) that is a member of the cluster:
// when the Server's Router implements router.MemberChecker (etcdrouter
// does), one that it says is live; otherwise any edge the CA named.
// DialRoute talks only to a peer whose certificate names the edge it
// dialled. Any other certificate of the CA (another service's, one without
// extended key usages) opens nothing. A refused peer is counted as
// edge.ReasonRelayRefused and logged at most once per 10 seconds (at the Warn
// level, with how many were refused since), so that strangers cannot
// choose the log volume.
//
// A relay stream names an agent session, an endpoint of it, the client
// and the host; the Server serves it (edge.Server.ServeRelayStream) only
// if it holds that route now. The client's address, and the forwarding
// headers in the stream's bytes, are taken as the peer wrote them: they
// are trusted because the peer is a member of the cluster, which is what
// admission is for.
type Relay struct {
	// Server is this edge. Routes whose Edge is its ID, or empty, are
	// dialled on it directly. Required.
	Server *edge.Server

	// TLSConfig authenticates edges to each other, both ways: its
	// Certificates are this edge's, its RootCAs and ClientCAs the
	// authority that signs the cluster's edges (and only them: see
	// PeerIDs). Serve requires and verifies the client's certificate
	// whatever ClientAuth says. Required.
	TLSConfig *tls.Config

	// PeerIDs returns the IDs of the edges that a peer's certificate,
	// verified against TLSConfig's CAs, stands for; none refuses the
	// peer. Serve admits a peer one of whose IDs is a member of the
	// cluster; DialRoute requires the ID of the edge it dials among them,
	// and Serve requires this edge's Server.ID among those of its own
	// certificate (when TLSConfig.Certificates holds it). Nil:
	// CertPeerIDs, the tunnelkit-edge://<ID> URIs of a certificate for
	// both serverAuth and clientAuth.
	PeerIDs func(cert *x509.Certificate) []string

	// Resolve returns the address of the relay listener of the edge with
	// ID id. Nil: the ID is the address ("10.0.0.2:7443").
	Resolve func(ctx context.Context, id string) (addr string, err error)

	// Logger receives the relay's logs. Nil: the Server's.
	Logger *slog.Logger

	// HandshakeTimeout bounds the dial and TLS handshake of a relay
	// session, and a relay stream's header. Zero: the Server's
	// Timeouts.Handshake, or edge.DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration

	mu        sync.Mutex
	closed    bool
	peers     map[string]*peer
	listeners map[net.Listener]struct{}
	sessions  map[*wire.Session]struct{} // accepted from peers
	wg        sync.WaitGroup
	refusals  refusalLog
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

// ErrClosed is returned by a Relay's methods after Close.
var ErrClosed = errors.New("relay: closed")

var _ edge.Dialer = (*Relay)(nil)

func (rl *Relay) log() *slog.Logger {
	switch {
	case rl.Logger != nil:
		return rl.Logger
	case rl.Server.Logger != nil:
		return rl.Server.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// handshake is HandshakeTimeout resolved.
func (rl *Relay) handshake() time.Duration {
	return cmp.Or(rl.HandshakeTimeout, max(rl.Server.Timeouts.Handshake, 0), edge.DefaultHandshakeTimeout)
}

// window is the stream window of relay sessions: the Server's.
func (rl *Relay) window() uint32 { return wire.ClampWindow(rl.Server.Limits.StreamWindow) }

func (rl *Relay) peerIDs(cert *x509.Certificate) []string {
	if rl.PeerIDs != nil {
		return rl.PeerIDs(cert)
	}
	return CertPeerIDs(cert)
}

// admit returns the ID of the member of the cluster that cert, verified
// against the cluster's CA, names; an error if it names none.
func (rl *Relay) admit(ctx context.Context, cert *x509.Certificate) (string, error) {
	ids := rl.peerIDs(cert)
	if len(ids) == 0 {
		return "", errNotAnEdge
	}
	mc, ok := rl.Server.Router.(router.MemberChecker)
	if !ok {
		return ids[0], nil
	}
	var errs []error
	for _, id := range ids {
		member, err := mc.IsMember(ctx, id)
		if err == nil && member {
			return id, nil
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return "", fmt.Errorf("relay: peer: membership of %q unknown: %w", ids, err)
	}
	return "", fmt.Errorf("relay: peer: %q not a member of the cluster", ids)
}

// relayLogWindow is the least time between two log lines about refused
// relay peers.
const relayLogWindow = 10 * time.Second

// refusalLog logs refused relay peers: the first at once, then at most
// one line per relayLogWindow, saying how many were refused since the
// last line and why the latest was.
type refusalLog struct {
	mu   sync.Mutex
	last time.Time // of the last line
	n    int       // refusals not logged yet
}

func (l *refusalLog) note(log *slog.Logger, peer string, err error) {
	l.mu.Lock()
	l.n++
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < relayLogWindow {
		l.mu.Unlock()
		return
	}
	n := l.n
	l.n, l.last = 0, now
	l.mu.Unlock()
	log.Warn("relay peers refused", "refused", n, "last_peer", peer, "last_err", err)
}

// refuse counts and logs a refused relay peer.
func (rl *Relay) refuse(peer net.Addr, err error) {
	if o := rl.Server.Observer; o != nil {
		o.Refused(edge.ReasonRelayRefused)
	}
	rl.refusals.note(rl.log(), peer.String(), err)
}

// DialRoute opens the conn to r's agent: on this edge when it holds the
// route, else through a relay stream to the edge that does.
func (rl *Relay) DialRoute(ctx context.Context, r router.Route, c edge.ConnInfo) (net.Conn, error) {
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
			return nil, fmt.Errorf("%w: edge %q: %w", edge.ErrNoSession, r.Edge, err)
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
			return nil, fmt.Errorf("%w: edge %q: %w", edge.ErrNoSession, r.Edge, err)
		}
	}
}

// session returns the session to the edge id, dialling it if needed.
func (rl *Relay) session(ctx context.Context, id string) (*wire.Session, error) {
	rl.mu.Lock()
	if rl.closed {
		rl.mu.Unlock()
		return nil, ErrClosed
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
		return nil, errors.New("relay: Relay.TLSConfig is required")
	}
	cfg := rl.TLSConfig.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	cfg.VerifyConnection = rl.verifyWith(cfg.VerifyConnection, func(cert *x509.Certificate) error {
		if !slices.Contains(rl.peerIDs(cert), id) {
			return fmt.Errorf("relay: the certificate of %s names edges %q, not %q", addr, rl.peerIDs(cert), id)
		}
		return nil
	})
	// The dial and the handshake within the handshake timeout, as
	// tls.Dialer bounds them, with the TLS conn over BatchWrites.
	dctx, cancel := context.WithTimeout(ctx, rl.handshake())
	defer cancel()
	raw, err := (&net.Dialer{KeepAlive: 15 * time.Second}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	conn := tls.Client(wire.BatchWrites(raw), cfg)
	if err := conn.HandshakeContext(dctx); err != nil {
		raw.Close()
		return nil, err
	}
	sess := wire.NewSession(conn, rl.window(), true, 0)
	p.sess = sess
	rl.log().Info("relay session opened", "edge", id, "addr", addr)
	if !rl.goTracked(func() {
		sess.Wait()
		rl.drop(id, sess)
		rl.log().Info("relay session closed", "edge", id, "addr", addr)
	}) {
		sess.Close()
		p.sess = nil
		return nil, ErrClosed
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
	if rl.TLSConfig == nil {
		ln.Close()
		return errors.New("relay: Relay.TLSConfig is required")
	}
	cfg := rl.TLSConfig.Clone()
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	if err := rl.checkOwnCertificate(cfg); err != nil {
		ln.Close()
		return err
	}
	rl.mu.Lock()
	if rl.closed {
		rl.mu.Unlock()
		ln.Close()
		return fmt.Errorf("relay: %w", net.ErrClosed)
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
				return fmt.Errorf("relay: %w", net.ErrClosed)
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

// checkOwnCertificate makes sure that this edge's own certificate, if cfg
// holds it, names this edge: its peers would refuse it otherwise.
func (rl *Relay) checkOwnCertificate(cfg *tls.Config) error {
	id := rl.Server.ID
	if id == "" || len(cfg.Certificates) == 0 || len(cfg.Certificates[0].Certificate) == 0 {
		return nil
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		return fmt.Errorf("relay: Relay.TLSConfig's certificate: %w", err)
	}
	if ids := rl.peerIDs(leaf); !slices.Contains(ids, id) {
		return fmt.Errorf("relay: Relay.TLSConfig's certificate names edges %q, not this one (%q): the other edges would refuse it; issue it with the SAN URI:%s and the serverAuth and clientAuth extended key usages", ids, id, PeerURIScheme+"://"+id)
	}
	return nil
}

// verifyWith returns a tls.Config.VerifyConnection that runs next (when
// not nil), then check on the peer's leaf certificate.
func (rl *Relay) verifyWith(next func(tls.ConnectionState) error, check func(*x509.Certificate) error) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if next != nil {
			if err := next(cs); err != nil {
				return err
			}
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("relay: the peer sent no certificate")
		}
		return check(cs.PeerCertificates[0])
	}
}

// serveSession authenticates a peer edge and serves its relay streams.
func (rl *Relay) serveSession(c net.Conn, base *tls.Config) {
	var peerID string
	ctx, cancel := context.WithTimeout(context.Background(), rl.handshake())
	defer cancel()
	cfg := base.Clone()
	cfg.VerifyConnection = rl.verifyWith(cfg.VerifyConnection, func(cert *x509.Certificate) error {
		var err error
		peerID, err = rl.admit(ctx, cert)
		return err
	})
	tc := tls.Server(wire.BatchWrites(c), cfg)
	tc.SetDeadline(time.Now().Add(rl.handshake()))
	if err := tc.HandshakeContext(ctx); err != nil {
		rl.refuse(c.RemoteAddr(), err)
		c.Close()
		return
	}
	cancel()
	tc.SetDeadline(time.Time{})
	sess := wire.NewSession(tc, rl.window(), false, relayBacklog)
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
	rl.log().Info("relay session accepted", "edge", peerID, "peer", c.RemoteAddr().String())
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		if !rl.goTracked(func() { rl.Server.ServeRelayStream(st, peerID) }) {
			st.Close()
			return
		}
	}
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
	verdict wire.Verdict
}

func (c *relayStream) Read(b []byte) (int, error) {
	if err := c.verdict.Read(c.Stream, edge.ErrNoEndpoint, edge.ErrAppUnreachable, edge.ErrAppDown); err != nil {
		return 0, err
	}
	return c.Stream.Read(b)
}

// Replied returns a channel closed once the agent's reply was read (by a
// Read, or by ReadReply).
func (c *relayStream) Replied() <-chan struct{} { return c.verdict.Ready() }

// ReadReply reads the agent's reply, if no Read did, and returns what it
// said: nil when its app took the connection.
func (c *relayStream) ReadReply() error {
	return c.verdict.Read(c.Stream, edge.ErrNoEndpoint, edge.ErrAppUnreachable, edge.ErrAppDown)
}
