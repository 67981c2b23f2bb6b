package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/hashicorp/go-multierror"
	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

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
//
// Reading the returned conn first reads the agent's reply: when the agent
// could not hand the connection to its app, Read fails with an error
// wrapping ErrAppUnreachable.
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
	var errs *multierror.Error
	hr, _ := s.router().(HealthReporter)
	for _, r := range routes {
		conn, err := s.dialer().DialRoute(ctx, r, c)
		if err == nil {
			if hr != nil {
				hr.Succeed(r)
			}
			return conn, r, nil
		}
		errs = multierror.Append(errs, err)
		if hr != nil {
			hr.Fail(r)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if errs == nil {
		return nil, Route{}, errNoRoute
	}
	return nil, Route{}, errs.ErrorOrNil()
}

var errNoRoute = errors.New("edge: no route")

// openProxy opens a proxy stream carrying h first.
func (ss *session) openProxy(ctx context.Context, h wire.ProxyHeader) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// An idle stream of a public HTTP connection gives its place to a live
	// connection or request.
	if !ss.acquire() && !(ss.srv.evictIdle(ss.id) && ss.acquire()) {
		return nil, errTooManyStreams
	}
	st, err := ss.mux.OpenStream()
	if err != nil {
		ss.open.Add(-1)
		return nil, fmt.Errorf("edge: open stream: %w", err)
	}
	c := &proxyStream{Stream: st, ss: ss}
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
// byte.
type proxyStream struct {
	muxado.Stream
	ss        *session
	closeOnce sync.Once

	replyMu  sync.Mutex
	replied  bool
	replyErr error // why the agent did not hand the conn to its app
}

// reply reads the agent's reply once; later calls return its verdict.
func (p *proxyStream) reply() error {
	p.replyMu.Lock()
	defer p.replyMu.Unlock()
	if p.replied {
		return p.replyErr
	}
	r, err := wire.ReadReply(p.Stream)
	if err != nil {
		return err // the stream broke: not a verdict, Read reports it as is
	}
	p.replied = true
	switch r.Status {
	case wire.ReplyOK:
	case wire.ReplyNoEndpoint:
		p.replyErr = fmt.Errorf("%w: %s", ErrNoEndpoint, wire.Printable(r.Message, 200))
	default:
		p.replyErr = fmt.Errorf("%w: %s", ErrAppUnreachable, wire.Printable(r.Message, 200))
	}
	return p.replyErr
}

func (p *proxyStream) Read(b []byte) (int, error) {
	if err := p.reply(); err != nil {
		return 0, err
	}
	return p.Stream.Read(b)
}

func (p *proxyStream) Close() error {
	err := p.Stream.Close()
	p.closeOnce.Do(func() { p.ss.open.Add(-1) })
	return err
}
