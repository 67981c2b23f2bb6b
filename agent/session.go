package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// A session to one edge: opening it (the transport, the preamble, the
// hello), its heartbeat, the streams it accepts, its end.

// connect opens a session to the edge at addr, within ctx and
// edgeTimeout. The caller holds connectMu.
func (c *Client) connect(ctx context.Context, addr string) (*wire.Session, error) {
	if c.tlsConfig(addr) != nil {
		// The turn first, within ctx alone: an attempt's time is the
		// edge's, not the line's.
		release, err := takeTurn(ctx)
		if err != nil {
			return nil, err
		}
		t := &heldTurn{release: release}
		defer t.done()
		ctx = context.WithValue(ctx, heldTurnKey{}, t)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, edgeTimeout, errEdgeTimeout)
	defer cancel()
	return c.open(ctx, addr)
}

// open opens a session: the transport, the mux, the hello. It installs
// the session and starts its goroutines.
func (c *Client) open(ctx context.Context, addr string) (*wire.Session, error) {
	h, err := c.handshake(ctx, addr)
	if err != nil {
		return nil, err
	}
	if err := c.install(h, nil, nil); err != nil {
		return nil, err
	}
	return h.mux, nil
}

// Test hooks: install calls the first as it starts, sessionEnded the
// second once it is done.
var (
	testHookInstall      atomic.Pointer[func(*opened)]
	testHookSessionEnded atomic.Pointer[func(*wire.Session)]
)

// opened is a session whose hello the edge accepted, not yet the client's.
type opened struct {
	mux       *wire.Session
	addr      string
	hello     *wire.HelloResp
	accepting chan struct{}   // closed by install: proxy streams wait for it
	dead      <-chan struct{} // closed when the session ends
}

// handshake opens a session to addr, and says hello with the client's
// session ticket, within ctx.
func (c *Client) handshake(ctx context.Context, addr string) (*opened, error) {
	conn, window, err := c.reach(ctx, addr)
	if err != nil {
		return nil, err
	}
	mux := c.newSession(conn, window, addr)
	// Serve the edge's streams before the hello, so that its heartbeat is
	// answered from the start.
	accepting := make(chan struct{})
	dead := make(chan struct{}) // closed when the session ends
	c.serve(mux, addr, accepting, dead)
	var resp wire.Response
	c.mu.Lock()
	ticket := c.ticket
	c.mu.Unlock()
	hello := wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: c.Token, Agent: "tunnelkit-agent", Ticket: ticket}}
	err = c.call(ctx, mux, hello, &resp)
	if err == nil && resp.HelloResp == nil {
		err = fmt.Errorf("%w: hello answered without a session", ErrRefused)
	}
	if err != nil {
		close(accepting)
		mux.Close()
		return nil, err
	}
	return &opened{mux: mux, addr: addr, hello: resp.HelloResp, accepting: accepting, dead: dead}, nil
}

// install makes h the client's session, in the place of left (nil: of
// none), and registers the tunnels bound on it. It fails, closing h's
// session, once the client is closed, when the client's session is
// another than left (the caller holds connectMu: none opens meanwhile),
// or when h's session already ended: its end, which forgets the client's
// session (sessionEnded), came before it was the client's, and would
// leave it installed dead for good.
func (c *Client) install(h *opened, left *wire.Session, tunnels map[string]*Listener) error {
	if f := testHookInstall.Load(); f != nil {
		(*f)(h)
	}
	var err error
	select {
	case <-h.dead: // if it ends later, sessionEnded finds it the client's
		localErr, _, _ := h.mux.Wait()
		err = fmt.Errorf("agent: the session ended as it opened: %w", cmp.Or(localErr, net.ErrClosed))
	default:
	}
	c.mu.Lock()
	switch {
	case err != nil:
	case c.closed:
		err = fmt.Errorf("agent: %w", net.ErrClosed)
	case c.mux != nil && c.mux != left:
		err = errors.New("agent: another session was opened meanwhile")
	}
	if err != nil {
		c.mu.Unlock()
		close(h.accepting)
		h.mux.Close()
		return err
	}
	stopRenew := c.stopRenew
	c.mux = h.mux
	c.edge = h.addr
	c.sessionID = h.hello.SessionID
	c.version = h.hello.Version
	if h.hello.Ticket != "" {
		c.ticket = h.hello.Ticket
	}
	maps.Copy(c.byTunnel, tunnels)
	c.renewAfter = time.Duration(h.hello.RenewAfter) * time.Second
	c.keepAlive(h.mux, h.addr, h.hello.Version)
	c.stopRenew = nil
	if renew := c.renewAfter; renew > 0 {
		c.stopRenew = c.renewTickets(h.mux, renew, h.hello.Version >= wire.SessionTicketVersion)
	}
	c.mu.Unlock()
	if stopRenew != nil {
		stopRenew() // the session moved from's
	}
	close(h.accepting)
	c.log().Info("connected to edge", "edge", h.addr, "session", h.hello.SessionID)
	c.emit(Event{Kind: Connected, Addr: h.addr})
	return nil
}

// reach dials the edge at addr (through Client.Proxy if set), completes
// TLS if the edge is reached over it, and reads the edge's preamble: it
// returns the conn the session speaks on and the edge's window. When addr
// is not an edge, the error says what answers there (diagnose.go).
func (c *Client) reach(ctx context.Context, addr string) (net.Conn, uint32, error) {
	tlsCfg := c.tlsConfig(addr)
	release := func() {}
	if t, ok := ctx.Value(heldTurnKey{}).(*heldTurn); ok {
		release = t.done // connect took it
	} else if tlsCfg != nil {
		var err error
		if release, err = takeTurn(ctx); err != nil {
			return nil, 0, err
		}
	}
	defer func() { release() }()
	// Proxy hook (dial.go): the edge directly, or through Client.Proxy.
	conn, err := c.dialEdge(ctx, addr)
	if err != nil {
		return nil, 0, err
	}
	// Until the preamble is read, a probe may tell what answers at addr
	// when it is not an edge (diagnose.go).
	w := c.watch(ctx, conn, addr, tlsCfg)
	fail := func(handshake bool, err error) (net.Conn, uint32, error) {
		conn.Close()
		if found := w.stop(); found != nil {
			return nil, 0, found
		}
		return nil, 0, c.diagnose(ctx, addr, tlsCfg, handshake, err)
	}
	if tlsCfg != nil {
		tc := tls.Client(wire.BatchWrites(conn), tlsCfg)
		err := tc.HandshakeContext(ctx)
		release()
		release = func() {}
		if err != nil {
			return fail(true, fmt.Errorf("agent: TLS to edge: %w", ctxErr(ctx, err)))
		}
		conn = tc
	}
	window, err := c.preamble(ctx, conn)
	if err != nil {
		return fail(false, ctxErr(ctx, err))
	}
	if found := w.stop(); found != nil {
		conn.Close()
		return nil, 0, found
	}
	return conn, window, nil
}

// acceptBacklog is the room of a session's accept queue: the streams the
// edge opened that wait for the accepting goroutine.
const acceptBacklog = 32

// newSession starts the agent's side of a session on conn, with its
// bounds on what stalled and unread streams hold.
func (c *Client) newSession(conn net.Conn, window uint32, addr string) *wire.Session {
	// The edge opens a stream per public connection. A burst of them
	// waits for the session's accepting goroutine (Session.Serve) while
	// the queue is full, rather than being reset: the queue is short (a
	// queue of 1024 cost each session 16 KB).
	mux := wire.NewSession(conn, window, true, acceptBacklog)
	// Streams whose public clients stopped reading hold the app's bytes
	// on this host (the app's socket buffers above all): past a bound,
	// the one stalled the longest is cut, and with it the connection to
	// the app.
	mux.LimitStalled(wire.DefaultMaxStalled, wire.StallAfter, func(st *wire.Stream) {
		c.log().Debug("stream cut: its client stopped reading, and the session holds its bound of stalled streams", "edge", addr, "max", wire.DefaultMaxStalled)
	})
	mux.LimitUnread(wire.DefaultMaxUnread, nil)
	return mux
}

// preamble asks the edge for the stream window and returns the one it
// grants, within ctx.
func (c *Client) preamble(ctx context.Context, conn net.Conn) (uint32, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := wire.WritePreamble(conn, wire.ClampWindow(c.StreamWindow)); err != nil {
		return 0, err
	}
	window, err := wire.ReadPreamble(conn)
	if err != nil {
		return 0, err
	}
	if !stop() {
		return 0, ctx.Err()
	}
	return window, conn.SetDeadline(time.Time{})
}

// serve serves the edge's streams, each in a goroutine of its own, until
// the session ends, then closes dead. Proxy streams wait for accepting,
// closed once the session is installed. No goroutine waits for the next
// stream while none comes (wire.Session.Serve): an idle session's are
// muxado's reader and its writer.
func (c *Client) serve(mux *wire.Session, addr string, accepting <-chan struct{}, dead chan struct{}) {
	var streams sync.WaitGroup
	c.wg.Add(1)
	mux.Serve(func(st *wire.Stream) {
		streams.Go(func() { c.handleStream(st, mux, addr, accepting, dead) })
	}, func() {
		defer c.wg.Done()
		close(dead)
		streams.Wait()
		c.sessionEnded(mux)
	})
}

// sessionEnded forgets a session that died and reconnects when listeners
// are open; for a session the client moved off (see move), it forgets
// the tunnels it had, and binds again the endpoints that stayed on it.
func (c *Client) sessionEnded(mux *wire.Session) {
	if f := testHookSessionEnded.Load(); f != nil {
		defer (*f)(mux)
	}
	localErr, _, _ := mux.Wait()
	c.mu.Lock()
	for _, id := range c.leaving[mux] {
		delete(c.byTunnel, id)
	}
	delete(c.leaving, mux)
	farewell, said := c.farewells[mux]
	delete(c.farewells, mux)
	if c.mux != mux {
		stranded := false
		for l := range c.listeners {
			if _, ok := l.bound(mux); ok {
				stranded = true
			}
		}
		redial := stranded && !c.closed && !c.redialing
		c.redialing = c.redialing || redial
		c.mu.Unlock()
		if redial {
			c.wg.Go(c.reconnectLoop)
		}
		return
	}
	c.mux = nil
	stopRenew := c.stopRenew
	c.stopRenew = nil
	edge := c.edge
	c.byTunnel = map[string]*Listener{}
	closed := c.closed
	redial := !closed && len(c.listeners) > 0 && !c.redialing
	if redial {
		c.redialing = true
	}
	c.mu.Unlock()
	if stopRenew != nil {
		stopRenew()
	}
	if !closed {
		// Disconnected comes before any event of the reconnection.
		if said {
			// The edge said why: its words, not the closed connection's.
			localErr = fmt.Errorf("%w: %s", ErrEnded, farewell)
			c.log().Warn("the edge ended the session", "edge", edge, "reason", farewell)
		} else {
			c.log().Warn("session to edge ended", "edge", edge, "err", localErr)
		}
		c.emit(Event{Kind: Disconnected, Err: localErr, Addr: edge})
	}
	if redial {
		c.wg.Go(c.reconnectLoop)
	}
}

// keepAlive keeps the session alive in the way of the version the edge
// answered with: PING frames on a timer from wire.PingFrameVersion on,
// ping streams from version 3 (no goroutine at rest), a heartbeat stream
// before.
func (c *Client) keepAlive(mux *wire.Session, addr string, version int) {
	if version < wire.PingVersion {
		c.wg.Go(func() { c.heartbeat(mux, addr) })
		return
	}
	p := &wire.Pinger{
		Interval: c.HeartbeatInterval,
		Timeout:  c.HeartbeatTimeout,
		Frames:   version >= wire.PingFrameVersion,
		Dead: func() {
			c.log().Warn("edge missed its heartbeat, or its session takes no more streams; closing the session", "edge", addr)
			mux.Close()
		},
	}
	p.Start(mux) // it stops when the session ends
}

// heartbeat pings the edge over a version 2 session's heartbeat stream and
// closes the session when it stops answering, or when the stream cannot be
// opened or ends: it is the session's only watch on the edge.
func (c *Client) heartbeat(mux *wire.Session, addr string) {
	defer mux.Close()
	st, err := mux.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	if _, err := st.Write([]byte{byte(wire.StreamHeartbeat)}); err != nil {
		return
	}
	hb := wire.Heartbeat{
		Interval: c.HeartbeatInterval,
		Timeout:  c.HeartbeatTimeout,
		Heard:    mux.Heard,
		Dead: func() {
			c.log().Warn("edge missed its heartbeat; closing the session", "edge", addr)
			mux.Close()
		},
	}
	if err := hb.Run(st); err != nil && !mux.Over() {
		c.log().Debug("heartbeat stream ended; closing the session", "edge", addr, "err", err)
	}
}
