package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// DialRoute opens a stream to r's agent on the session this server holds,
// starting with the proxy header that tells the agent who the client is. It
// is the default Dialer; a custom Dialer can call it for local routes.
//
// Reading the returned conn first reads the agent's reply: when the agent
// could not hand the connection to its app, Read fails with an error
// wrapping ErrAppUnreachable.
func (s *Server) DialRoute(ctx context.Context, r router.Route, c ConnInfo) (net.Conn, error) {
	s.init()
	return s.dial(ctx, r, c, false)
}

// dialRaw is DialRoute for a relay: the agent's reply is left for the
// other edge to read.
func (s *Server) dialRaw(ctx context.Context, r router.Route, c ConnInfo) (net.Conn, error) {
	return s.dial(ctx, r, c, true)
}

func (s *Server) dial(ctx context.Context, r router.Route, c ConnInfo, raw bool) (net.Conn, error) {
	if r.Edge != "" && r.Edge != s.ID {
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
	}, raw)
}

// dialRoutes dials the first reachable route of routes, reporting failures
// to the router so later lookups try those routes last, and to failed,
// when not nil. A route whose agent says when its app took a conn
// (router.Route.Admits) is reported reached only then, by the caller (see
// reached): an agent that answers for an app that does not is no success.
func (s *Server) dialRoutes(ctx context.Context, routes []router.Route, c ConnInfo, failed func(router.Route, error)) (net.Conn, router.Route, error) {
	var errs errorList
	for _, r := range routes {
		conn, err := s.dialer().DialRoute(ctx, r, c)
		if err == nil {
			if !r.Admits {
				s.reached(r)
			}
			return conn, r, nil
		}
		errs.add(err)
		s.unreached(r)
		if failed != nil {
			failed(r, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err := errs.err(); err != nil {
		return nil, router.Route{}, err
	}
	return nil, router.Route{}, errNoRoute
}

var errNoRoute = errors.New("edge: no route")

// reached tells the Router, if it wants to hear it (router.HealthReporter),
// that r's agent took a conn; unreached that r's agent, or its app, could
// not be reached, so that later lookups try r after the others.
func (s *Server) reached(r router.Route) {
	if hr, ok := s.router().(router.HealthReporter); ok {
		hr.Succeed(r)
	}
}

func (s *Server) unreached(r router.Route) {
	if hr, ok := s.router().(router.HealthReporter); ok {
		hr.Fail(r)
	}
}

// openProxy opens a proxy stream carrying h first.
func (ss *session) openProxy(ctx context.Context, h wire.ProxyHeader, raw bool) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ss.mu.Lock()
	ep, _ := ss.endpointLocked(h.TunnelID)
	ss.mu.Unlock()
	if ep.Down() {
		return nil, fmt.Errorf("%w: %s", ErrAppDown, ep.URL)
	}
	// An idle stream of a public HTTP connection gives its place to a live
	// connection or request.
	if !ss.acquire() && !(ss.srv.ups.EvictIdle(ss.srv.ID, ss.id) && ss.acquire()) {
		return nil, errTooManyStreams
	}
	st, err := ss.mux.OpenStream()
	if err != nil {
		ss.release()
		// A session that can open no stream (its agent sent GOAWAY, or it
		// died) carries nothing more: it ends, and its names with it, in a
		// goroutine (the caller tries the name's other routes meanwhile).
		ss.srv.goTracked(func() { ss.close(ss.srv.cfg().grace) })
		return nil, fmt.Errorf("edge: open stream: %w", err)
	}
	c := &proxyStream{Stream: st, ss: ss, raw: raw, ep: ep}
	ep.Opened(h.Proto)
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

// proxyStream is a stream to an agent. It counts against the session's
// bound until closed, and reads the agent's reply before the app's first
// byte, unless raw (a relay passes the reply on to the edge that asked).
// Close never waits for the agent (see wire.Stream); Reset cuts the
// exchange short, so that the agent drops the connection to its app.
type proxyStream struct {
	*wire.Stream
	ss        *session
	ep        *book.Endpoint // counts the stream's traffic; nil if it went
	raw       bool
	closeOnce sync.Once
	verdict   wire.Verdict
}

func (p *proxyStream) Read(b []byte) (int, error) {
	if !p.raw {
		if err := p.verdict.Read(p.Stream, ErrNoEndpoint, ErrAppUnreachable, ErrAppDown); err != nil {
			return 0, err
		}
	}
	n, err := p.Stream.Read(b)
	p.ep.Received(n)
	return n, err
}

// Replied returns a channel closed once the agent's reply was read (by a
// Read, or by ReadReply).
func (p *proxyStream) Replied() <-chan struct{} { return p.verdict.Ready() }

// ReadReply reads the agent's reply, if no Read did, and returns what it
// said: nil when its app took the connection.
func (p *proxyStream) ReadReply() error {
	return p.verdict.Read(p.Stream, ErrNoEndpoint, ErrAppUnreachable, ErrAppDown)
}

// replier is a conn to an agent, local or relayed, whose reply may be
// waited for: whether the agent's app took the connection.
type replier interface {
	Replied() <-chan struct{}
	ReadReply() error
}

var (
	_ replier = (*proxyStream)(nil)
)

func (p *proxyStream) Write(b []byte) (int, error) {
	n, err := p.Stream.Write(b)
	p.ep.Sent(n)
	return n, err
}

func (p *proxyStream) Close() error {
	err := p.Stream.Close()
	p.closeOnce.Do(p.closed)
	return err
}

// Reset ends the stream at once both ways, telling the agent that the
// connection was cut short.
func (p *proxyStream) Reset() {
	p.Stream.Reset()
	p.closeOnce.Do(p.closed)
}

func (p *proxyStream) closed() {
	p.ss.release()
	p.ep.Closed()
}

// addrPort returns a conn address as a netip.AddrPort, IPv4 unmapped.
func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (s *Server) dialer() Dialer {
	if s.Dialer != nil {
		return s.Dialer
	}
	return s
}
