package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Upstreams: the HTTP connections from the edge to agents' apps.
//
// An upstream is an HTTP connection, net/http's own ClientConn, over one
// conn to an agent (a stream, whose header names the public client):
// HTTP/1.1, or HTTP/2 with prior knowledge for routes bound with the app
// protocol h2c (gRPC needs its trailers and streams both ways). Since a
// stream's header names one client, an upstream carries the requests of
// one public connection: when the edge serves that connection itself
// (ServeHTTPListener, ServeSNI), its next request to the same route and
// Host reuses an upstream of its own (an idle HTTP/1.1 one, or its shared
// HTTP/2 one); any other request gets a new upstream. When the Server is
// mounted as a handler in another server, each request gets an upstream of
// its own, closed after it. An idle upstream goes when its public
// connection closes, when its route is unbound, when the agent closes its
// stream (net/http's reader notices), and when its session needs the
// stream for a live request.

// maxUpstreamsPerConn bounds the upstreams one public connection keeps:
// one for HTTP/1.1, which sends a request at a time; for HTTP/2, as many as
// its requests ran at once, up to this.
const maxUpstreamsPerConn = 64

// expectContinueTimeout is how long an upstream waits for the app's
// "100 Continue" before it sends a request body the client announced with
// "Expect: 100-continue" anyway (curl waits as long). Until the app asks
// for the body, the edge does not ask the client for it either, so an app
// can refuse an upload before it is sent.
const expectContinueTimeout = time.Second

// upstream is an HTTP connection to an app over a conn to its agent.
type upstream struct {
	cc      *http.ClientConn
	conn    *exchangeConn
	route   router.Route
	host    string      // the Host of its requests, named in its conn's header
	owner   *publicConn // the public connection whose requests it carries; nil: one request
	h2      bool
	changed chan struct{} // signalled when the connection's state changes (buffered 1)

	// busy is set while an exchange of the owner uses the upstream (an
	// HTTP/1.1 one is then not for another); retired makes it close once
	// no request is in flight. Guarded by upstreams.mu.
	busy    int
	retired bool
	gone    atomic.Bool // closed, or going
}

// publicConn is a public HTTP connection the edge serves.
type publicConn struct {
	ups    []*upstream // its upstreams; guarded by upstreams.mu
	closed bool        // likewise
}

type publicConnKey struct{}

// publicConnOf returns the public connection of a request the edge serves
// itself; nil for one it got as a mounted handler.
func publicConnOf(r *http.Request) *publicConn {
	pc, _ := r.Context().Value(publicConnKey{}).(*publicConn)
	return pc
}

// upstreams indexes the upstreams of public connections by route.
type upstreams struct {
	mu      sync.Mutex
	byRoute map[router.RouteKey]map[*upstream]struct{}

	once   sync.Once
	h1, h2 *http.Transport // make the ClientConns, over the conn in the dial's context
}

type dialConnKey struct{}

// transports returns the transports upstreams are made with.
func (s *Server) transports() (h1, h2 *http.Transport) {
	u := &s.ups
	u.once.Do(func() {
		mk := func(h2 bool) *http.Transport {
			t := &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					c, _ := ctx.Value(dialConnKey{}).(net.Conn)
					if c == nil {
						return nil, errors.New("edge: no conn to speak HTTP on")
					}
					return c, nil
				},
				// A proxy passes the body as the app encoded it.
				DisableCompression:    true,
				ResponseHeaderTimeout: s.cfg.responseHeader,
				ExpectContinueTimeout: expectContinueTimeout,
			}
			p := new(http.Protocols)
			if h2 {
				p.SetUnencryptedHTTP2(true)
				// What the app sends for clients that stopped reading waits
				// in these buffers: a stream window each, as over the
				// agent's session, and a bounded whole.
				t.HTTP2 = &http.HTTP2Config{
					MaxReceiveBufferPerStream:     int(s.cfg.window),
					MaxReceiveBufferPerConnection: 4<<20 - 1,
				}
			} else {
				p.SetHTTP1(true)
			}
			t.Protocols = p
			return t
		}
		u.h1, u.h2 = mk(false), mk(true)
	})
	return u.h1, u.h2
}

// upstreamFor returns an upstream for a request to one of routes for
// host, with a request reserved on it: one of pc's own when one goes to
// the same route and host and is free, else a new one over a conn to the
// first of routes that can be reached. reused says the upstream carried a
// request before.
func (s *Server) upstreamFor(ctx context.Context, routes []router.Route, info ConnInfo, pc *publicConn) (up *upstream, reused bool, err error) {
	if pc != nil {
		if up := s.takeUpstream(ctx, pc, routes, info.Host); up != nil {
			return up, true, nil
		}
	}
	up, err = s.dialUpstream(ctx, routes, info, pc)
	return up, false, err
}

// dialUpstream returns a new upstream over a conn to the first of routes
// that can be reached.
func (s *Server) dialUpstream(ctx context.Context, routes []router.Route, info ConnInfo, pc *publicConn) (*upstream, error) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.handshake)
	defer cancel()
	conn, route, err := s.dialRoutes(dctx, routes, info)
	if err != nil {
		return nil, err
	}
	return s.newUpstream(conn, route, info.Host, pc)
}

// newUpstream starts an HTTP connection over conn, a conn just dialled to
// route, with a request reserved on it, and makes it one of pc's when
// pc can keep one more.
func (s *Server) newUpstream(conn net.Conn, route router.Route, host string, pc *publicConn) (*upstream, error) {
	up := &upstream{
		conn:    newExchangeConn(conn),
		route:   route,
		host:    host,
		h2:      route.AppProtocol == wire.AppProtocolH2C,
		changed: make(chan struct{}, 1),
		busy:    1,
	}
	h1t, h2t := s.transports()
	t := h1t
	if up.h2 {
		t = h2t
	}
	// The dial returns at once: the conn is open.
	ctx := context.WithValue(context.Background(), dialConnKey{}, net.Conn(up.conn))
	cc, err := t.NewClientConn(ctx, "http", route.TunnelID+":80")
	if err == nil {
		if err = cc.Reserve(); err != nil {
			cc.Close()
		}
	}
	if err != nil {
		// The conn broke before the request went out: the agent's reply
		// came first (a refusal, or garbage), and net/http's reader saw it
		// on a conn with no request yet.
		reset(up.conn)
		if refused := up.conn.refusal(); refused != nil {
			return nil, refused
		}
		return nil, fmt.Errorf("%w: %w", errUpstreamBroke, err)
	}
	up.cc = cc
	cc.SetStateHook(func(*http.ClientConn) { s.upstreamChanged(up) })
	if pc != nil {
		s.adopt(pc, up)
	}
	return up, nil
}

// adopt makes up one of pc's upstreams, when pc is open and has room.
func (s *Server) adopt(pc *publicConn, up *upstream) {
	u := &s.ups
	u.mu.Lock()
	defer u.mu.Unlock()
	if pc.closed || len(pc.ups) >= maxUpstreamsPerConn {
		return // this request's own: closed after it
	}
	up.owner = pc
	pc.ups = append(pc.ups, up)
	k := up.route.Key()
	if u.byRoute == nil {
		u.byRoute = map[router.RouteKey]map[*upstream]struct{}{}
	}
	if u.byRoute[k] == nil {
		u.byRoute[k] = map[*upstream]struct{}{}
	}
	u.byRoute[k][up] = struct{}{}
}

// serves reports whether up may carry a request to one of routes for host.
func (up *upstream) serves(routes []router.Route, host string) bool {
	if up.gone.Load() || up.host != host {
		return false
	}
	k := up.route.Key()
	return slices.ContainsFunc(routes, func(r router.Route) bool { return r.Key() == k })
}

// takeUpstream returns one of pc's upstreams for routes and host with a
// request reserved on it, or nil. An HTTP/1.1 upstream whose last exchange
// just ended may still be finishing its response: it is waited for (it
// becomes free or closes at once).
func (s *Server) takeUpstream(ctx context.Context, pc *publicConn, routes []router.Route, host string) *upstream {
	u := &s.ups
	u.mu.Lock()
	var candidates []*upstream
	for i := len(pc.ups) - 1; i >= 0; i-- {
		up := pc.ups[i]
		if (up.h2 || up.busy == 0) && !up.retired && up.serves(routes, host) {
			up.busy++
			candidates = append(candidates, up)
		}
	}
	u.mu.Unlock()
	var taken *upstream
	for _, up := range candidates {
		if taken == nil && up.reserve(ctx) == nil {
			taken = up
			continue
		}
		s.doneUpstream(up, false)
	}
	return taken
}

// reserve reserves a request on up. An HTTP/1.1 connection whose last
// response was read whole becomes free a moment later (net/http's reader
// notices the end): reserve waits for that, or for the connection to
// close.
func (up *upstream) reserve(ctx context.Context) error {
	for {
		err := up.cc.Reserve()
		if err == nil || up.h2 || up.cc.Err() != nil {
			if err == nil {
				err = up.cc.Err()
			}
			return err
		}
		select {
		case <-up.changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// upstreamChanged is up's state hook: a closed connection is forgotten,
// and a retired one closed once no request is in flight.
func (s *Server) upstreamChanged(up *upstream) {
	select {
	case up.changed <- struct{}{}:
	default:
	}
	if up.cc.Err() != nil {
		// net/http closed the conn (or, after a protocol switch, handed
		// it to the response's body, which closes it).
		up.gone.Store(true)
		s.forget(up)
		return
	}
	u := &s.ups
	u.mu.Lock()
	idle := up.busy == 0 && up.cc.InFlight() == 0
	retired := up.retired || up.owner == nil
	u.mu.Unlock()
	if idle && retired {
		s.forget(up)
		up.close()
	}
}

// doneUpstream ends an exchange's use of up. An HTTP/1.1 upstream whose
// exchange was cut short (or did not end cleanly: a request or response
// not whole) is reset, since it cannot carry another request; an HTTP/2
// one goes on, its request's stream reset by the exchange's end. One
// without an owner, or retired, is closed once idle; one of a public
// connection stays for its next request.
func (s *Server) doneUpstream(up *upstream, cut bool) {
	if cut && !up.h2 {
		s.forget(up)
		up.abort()
		return
	}
	u := &s.ups
	u.mu.Lock()
	up.busy--
	closeNow := up.busy == 0 && (up.owner == nil || up.retired) && up.cc.InFlight() == 0
	u.mu.Unlock()
	if closeNow {
		s.forget(up)
		up.close()
	}
}

// forget removes up from its public connection and the index.
func (s *Server) forget(up *upstream) {
	u := &s.ups
	u.mu.Lock()
	defer u.mu.Unlock()
	s.forgetLocked(up)
}

func (s *Server) forgetLocked(up *upstream) {
	u := &s.ups
	if pc := up.owner; pc != nil {
		if i := slices.Index(pc.ups, up); i >= 0 {
			pc.ups = slices.Delete(pc.ups, i, i+1)
		}
	}
	k := up.route.Key()
	delete(u.byRoute[k], up)
	if len(u.byRoute[k]) == 0 {
		delete(u.byRoute, k)
	}
}

// close closes up and its conn; requests in flight fail.
func (up *upstream) close() {
	if up.gone.Swap(true) {
		return
	}
	up.cc.Close()
	up.conn.Close()
}

// abort cuts up short: its conn is reset, so that the agent drops the
// connection to its app (and the app's request is cancelled).
func (up *upstream) abort() {
	up.gone.Store(true)
	reset(up.conn)
	up.cc.Close()
}

// retire closes up once its requests are done (now, if there are none).
func (s *Server) retire(up *upstream) {
	u := &s.ups
	u.mu.Lock()
	up.retired = true
	idle := up.busy == 0 && up.cc.InFlight() == 0
	if idle {
		s.forgetLocked(up)
	}
	u.mu.Unlock()
	if idle {
		up.close()
	}
}

// dropPublicConn forgets a public connection that closed, and closes its
// upstreams once their requests are done.
func (s *Server) dropPublicConn(pc *publicConn) {
	u := &s.ups
	u.mu.Lock()
	pc.closed = true
	ups := slices.Clone(pc.ups)
	u.mu.Unlock()
	for _, up := range ups {
		s.retire(up)
	}
}

// closeUpstreams closes the upstreams of r, whose endpoint is gone, once
// their requests are done.
func (s *Server) closeUpstreams(r router.Route) {
	u := &s.ups
	u.mu.Lock()
	var ups []*upstream
	for up := range u.byRoute[r.Key()] {
		ups = append(ups, up)
	}
	u.mu.Unlock()
	for _, up := range ups {
		s.retire(up)
	}
}

// evictIdle closes one idle upstream of the session sessionID, so that a
// live request can have its stream, and reports whether there was one.
func (s *Server) evictIdle(sessionID string) bool {
	u := &s.ups
	u.mu.Lock()
	var victim *upstream
	for k, ups := range u.byRoute {
		if k.Edge != s.ID || k.Session != sessionID {
			continue
		}
		for up := range ups {
			if up.busy == 0 && up.cc.InFlight() == 0 {
				victim = up
				break
			}
		}
		if victim != nil {
			break
		}
	}
	if victim != nil {
		s.forgetLocked(victim)
	}
	u.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.close()
	return true
}

// trackPublicConns makes hs tell the Server about its connections, so that
// their requests can reuse their upstreams.
func (s *Server) trackPublicConns(hs *http.Server, proto string) {
	var conns sync.Map // net.Conn to *publicConn
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		s.obs().Conn(proto)
		pc := &publicConn{}
		conns.Store(c, pc)
		return context.WithValue(ctx, publicConnKey{}, pc)
	}
	hs.ConnState = func(c net.Conn, state http.ConnState) {
		if state == http.StateClosed || state == http.StateHijacked {
			if pc, ok := conns.LoadAndDelete(c); ok {
				s.dropPublicConn(pc.(*publicConn))
			}
		}
	}
}

// atomicTime is a time read and written atomically.
type atomicTime struct{ ns atomic.Int64 }

func (t *atomicTime) store(v time.Time) { t.ns.Store(v.UnixNano()) }
func (t *atomicTime) load() time.Time   { return time.Unix(0, t.ns.Load()) }

// exchangeConn is the conn of an upstream: it keeps the agent's refusal,
// whatever the Dialer.
// errUpstreamBroke: a conn to an agent, open, broke before its first
// request was sent.
var errUpstreamBroke = errors.New("edge: the agent's stream broke before the request")

type exchangeConn struct {
	net.Conn
	mu      sync.Mutex
	refused error
}

func newExchangeConn(c net.Conn) *exchangeConn { return &exchangeConn{Conn: c} }

func (c *exchangeConn) refusal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

func (c *exchangeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && (errors.Is(err, ErrAppUnreachable) || errors.Is(err, ErrNoEndpoint)) {
		c.mu.Lock()
		c.refused = err
		c.mu.Unlock()
	}
	return n, err
}

// Reset cuts the conn short (see proxyStream.Reset).
func (c *exchangeConn) Reset() { reset(c.Conn) }
