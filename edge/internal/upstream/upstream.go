// Package upstream keeps the HTTP connections from an edge to agents'
// apps: each over one conn to an agent, reused by the requests of the one
// public connection it carries (Pool).
package upstream

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

// An upstream is an HTTP connection, net/http's own ClientConn, over one
// conn to an agent (a stream, whose header names the public client):
// HTTP/1.1, or HTTP/2 with prior knowledge for routes bound with the app
// protocol h2c (gRPC needs its trailers and streams both ways). Since a
// stream's header names one client, an upstream carries the requests of
// one public connection: when the edge serves that connection itself
// (an edge's ServeHTTPListener, ServeSNI; see Pool.Track), its next request to the same route and
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

// Upstream is an HTTP connection to an app over a conn to its agent.
type Upstream struct {
	cc      *http.ClientConn
	conn    *exchangeConn
	route   router.Route
	host    string // the Host of its requests, named in its conn's header
	owner   *Conn  // the public connection whose requests it carries; nil: one request
	h2      bool
	changed chan struct{} // signalled when the connection's state changes (buffered 1)

	// busy is set while an exchange of the owner uses the upstream (an
	// HTTP/1.1 one is then not for another); retired makes it close once
	// no request is in flight. Guarded by Pool.mu.
	busy    int
	retired bool
	gone    atomic.Bool // closed, or going
}

// RoundTrip sends req on the upstream, which Get or Dial reserved a
// request on.
func (up *Upstream) RoundTrip(req *http.Request) (*http.Response, error) { return up.cc.RoundTrip(req) }

// Route is the route the upstream reaches.
func (up *Upstream) Route() router.Route { return up.route }

// Conn is the conn to the agent the upstream speaks over, as dialled.
func (up *Upstream) Conn() net.Conn { return up.conn.Conn }

// H2 reports whether the upstream speaks HTTP/2 (the route's app protocol
// is h2c), else HTTP/1.1.
func (up *Upstream) H2() bool { return up.h2 }

// Refusal returns the agent's refusal of the upstream's conn (an error
// Pool.IsRefusal said yes to), if its conn read one.
//
// A request whose write failed (the agent refused and closed the stream)
// may fail before the read of the agent's reply returned: Refusal then
// waits for the reply, up to replyWait.
func (up *Upstream) Refusal() error { return up.conn.refusalAfter(replyWait) }

// replyWait bounds how long Refusal waits for an agent's reply that is
// on its way.
const replyWait = 500 * time.Millisecond

// ResetConn cuts the upstream's conn short, so that the agent drops its
// connection to the app (see reset).
func (up *Upstream) ResetConn() { reset(up.conn) }

// Conn is a public HTTP connection an edge serves.
type Conn struct {
	ups    []*Upstream // its upstreams; guarded by Pool.mu
	closed bool        // likewise
}

type connKey struct{}

// ConnOf returns the public connection of a request of a server the Pool
// tracks (Track); nil for another (an edge mounted as a handler).
func ConnOf(r *http.Request) *Conn {
	pc, _ := r.Context().Value(connKey{}).(*Conn)
	return pc
}

// Pool keeps the upstreams of public connections, indexed by route. Set
// its fields before the first Get; its zero value has no bound on waiting
// for a response header.
type Pool struct {
	// ResponseHeaderTimeout bounds the wait for an app to start
	// answering a request sent whole. Zero: no bound.
	ResponseHeaderTimeout time.Duration
	// StreamWindow is what an HTTP/2 upstream buffers of each stream for
	// a client that stopped reading (as over the agent's session). Zero:
	// net/http's default.
	StreamWindow int
	// IsRefusal reports whether an error read from an upstream's conn is
	// its agent's refusal of the conn (Upstream.Refusal). Nil: none is.
	IsRefusal func(error) bool

	mu      sync.Mutex
	byRoute map[router.RouteKey]map[*Upstream]struct{}

	once   sync.Once
	h1, h2 *http.Transport // make the ClientConns, over the conn in the dial's context
}

type dialConnKey struct{}

// transports returns the transports upstreams are made with.
func (u *Pool) transports() (h1, h2 *http.Transport) {
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
				ResponseHeaderTimeout: u.ResponseHeaderTimeout,
				ExpectContinueTimeout: expectContinueTimeout,
			}
			p := new(http.Protocols)
			if h2 {
				p.SetUnencryptedHTTP2(true)
				// What the app sends for clients that stopped reading waits
				// in these buffers: a stream window each, as over the
				// agent's session, and a bounded whole.
				t.HTTP2 = &http.HTTP2Config{
					MaxReceiveBufferPerStream:     u.StreamWindow,
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

// DialFunc dials a conn for a new upstream to the first of routes that
// can be reached, and returns the route it reached: the conn's header
// names the request's client and host.
type DialFunc func(ctx context.Context) (net.Conn, router.Route, error)

// Get returns an upstream for a request to one of routes for host, with a
// request reserved on it: one of pc's own when one goes to the same route
// and host and is free, else a new one over a conn from dial. reused says
// the upstream carried a request before. Done gives it back.
func (u *Pool) Get(ctx context.Context, routes []router.Route, host string, pc *Conn, dial DialFunc) (up *Upstream, reused bool, err error) {
	if pc != nil {
		if up := u.take(ctx, pc, routes, host); up != nil {
			return up, true, nil
		}
	}
	up, err = u.Dial(ctx, host, pc, dial)
	return up, false, err
}

// Dial returns a new upstream for a request for host over a conn from
// dial, with a request reserved on it.
func (u *Pool) Dial(ctx context.Context, host string, pc *Conn, dial DialFunc) (*Upstream, error) {
	conn, route, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	return u.newUpstream(conn, route, host, pc)
}

// newUpstream starts an HTTP connection over conn, a conn just dialled to
// route, with a request reserved on it, and makes it one of pc's when
// pc can keep one more.
func (u *Pool) newUpstream(conn net.Conn, route router.Route, host string, pc *Conn) (*Upstream, error) {
	up := &Upstream{
		conn:    &exchangeConn{Conn: conn, isRefusal: u.IsRefusal},
		route:   route,
		host:    host,
		h2:      route.AppProtocol == wire.AppProtocolH2C,
		changed: make(chan struct{}, 1),
		busy:    1,
	}
	h1t, h2t := u.transports()
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
			return nil, &RouteError{Route: route, Err: refused}
		}
		return nil, fmt.Errorf("%w: %w", ErrBroke, err)
	}
	up.cc = cc
	cc.SetStateHook(func(*http.ClientConn) { u.changed(up) })
	if pc != nil {
		u.adopt(pc, up)
	}
	return up, nil
}

// RouteError is an error of a conn to an agent, for the route it was
// dialled to: the agent's refusal of the conn, which came before the
// request went out.
type RouteError struct {
	Route router.Route
	Err   error
}

func (e *RouteError) Error() string { return e.Err.Error() }
func (e *RouteError) Unwrap() error { return e.Err }

// RouteOf returns the route of a RouteError in err's chain, or nil.
func RouteOf(err error) *router.Route {
	var re *RouteError
	if errors.As(err, &re) {
		return &re.Route
	}
	return nil
}

// adopt makes up one of pc's upstreams, when pc is open and has room.
func (u *Pool) adopt(pc *Conn, up *Upstream) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if pc.closed || len(pc.ups) >= maxUpstreamsPerConn {
		return // this request's own: closed after it
	}
	up.owner = pc
	pc.ups = append(pc.ups, up)
	k := up.route.Key()
	if u.byRoute == nil {
		u.byRoute = map[router.RouteKey]map[*Upstream]struct{}{}
	}
	if u.byRoute[k] == nil {
		u.byRoute[k] = map[*Upstream]struct{}{}
	}
	u.byRoute[k][up] = struct{}{}
}

// serves reports whether up may carry a request to one of routes for host.
func (up *Upstream) serves(routes []router.Route, host string) bool {
	if up.gone.Load() || up.host != host {
		return false
	}
	k := up.route.Key()
	return slices.ContainsFunc(routes, func(r router.Route) bool { return r.Key() == k })
}

// take returns one of pc's upstreams for routes and host with a
// request reserved on it, or nil. An HTTP/1.1 upstream whose last exchange
// just ended may still be finishing its response: it is waited for (it
// becomes free or closes at once).
func (u *Pool) take(ctx context.Context, pc *Conn, routes []router.Route, host string) *Upstream {
	u.mu.Lock()
	var candidates []*Upstream
	for i := len(pc.ups) - 1; i >= 0; i-- {
		up := pc.ups[i]
		if (up.h2 || up.busy == 0) && !up.retired && up.serves(routes, host) {
			up.busy++
			candidates = append(candidates, up)
		}
	}
	u.mu.Unlock()
	var taken *Upstream
	for _, up := range candidates {
		if taken == nil && up.reserve(ctx) == nil {
			taken = up
			continue
		}
		u.Done(up, false)
	}
	return taken
}

// reserve reserves a request on up. An HTTP/1.1 connection whose last
// response was read whole becomes free a moment later (net/http's reader
// notices the end): reserve waits for that, or for the connection to
// close.
func (up *Upstream) reserve(ctx context.Context) error {
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

// changed is up's state hook: a closed connection is forgotten, and a
// retired one closed once no request is in flight.
func (u *Pool) changed(up *Upstream) {
	select {
	case up.changed <- struct{}{}:
	default:
	}
	if up.cc.Err() != nil {
		// net/http closed the conn (or, after a protocol switch, handed
		// it to the response's body, which closes it).
		up.gone.Store(true)
		u.forget(up)
		return
	}
	u.mu.Lock()
	idle := up.busy == 0 && up.cc.InFlight() == 0
	retired := up.retired || up.owner == nil
	u.mu.Unlock()
	if idle && retired {
		u.forget(up)
		up.close()
	}
}

// Done ends an exchange's use of up. An HTTP/1.1 upstream whose
// exchange was cut short (or did not end cleanly: a request or response
// not whole) is reset, since it cannot carry another request; an HTTP/2
// one goes on, its request's stream reset by the exchange's end. One
// without an owner, or retired, is closed once idle; one of a public
// connection stays for its next request.
func (u *Pool) Done(up *Upstream, cut bool) {
	if cut && !up.h2 {
		u.forget(up)
		up.abort()
		return
	}
	u.mu.Lock()
	up.busy--
	closeNow := up.busy == 0 && (up.owner == nil || up.retired) && up.cc.InFlight() == 0
	u.mu.Unlock()
	if closeNow {
		u.forget(up)
		up.close()
	}
}

// forget removes up from its public connection and the index.
func (u *Pool) forget(up *Upstream) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.forgetLocked(up)
}

func (u *Pool) forgetLocked(up *Upstream) {
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
func (up *Upstream) close() {
	if up.gone.Swap(true) {
		return
	}
	up.cc.Close()
	up.conn.Close()
}

// abort cuts up short: its conn is reset, so that the agent drops the
// connection to its app (and the app's request is cancelled).
func (up *Upstream) abort() {
	up.gone.Store(true)
	reset(up.conn)
	up.cc.Close()
}

// retire closes up once its requests are done (now, if there are none).
func (u *Pool) retire(up *Upstream) {
	u.mu.Lock()
	up.retired = true
	idle := up.busy == 0 && up.cc.InFlight() == 0
	if idle {
		u.forgetLocked(up)
	}
	u.mu.Unlock()
	if idle {
		up.close()
	}
}

// drop forgets a public connection that closed, and closes its upstreams
// once their requests are done.
func (u *Pool) drop(pc *Conn) {
	u.mu.Lock()
	pc.closed = true
	ups := slices.Clone(pc.ups)
	u.mu.Unlock()
	for _, up := range ups {
		u.retire(up)
	}
}

// CloseRoute closes the upstreams of r, whose endpoint is gone, once
// their requests are done.
func (u *Pool) CloseRoute(r router.Route) {
	u.mu.Lock()
	var ups []*Upstream
	for up := range u.byRoute[r.Key()] {
		ups = append(ups, up)
	}
	u.mu.Unlock()
	for _, up := range ups {
		u.retire(up)
	}
}

// EvictIdle closes one idle upstream of the session sessionID of the edge
// edgeID, so that a live request can have its stream, and reports
// whether there was one.
func (u *Pool) EvictIdle(edgeID, sessionID string) bool {
	u.mu.Lock()
	var victim *Upstream
	for k, ups := range u.byRoute {
		if k.Edge != edgeID || k.Session != sessionID {
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
		u.forgetLocked(victim)
	}
	u.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.close()
	return true
}

// Track makes hs tell the Pool about its connections, so that their
// requests can reuse their upstreams (see ConnOf). opened, if set, is
// called with each connection hs opens.
func (u *Pool) Track(hs *http.Server, opened func()) {
	var conns sync.Map // net.Conn to *Conn
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if opened != nil {
			opened()
		}
		pc := &Conn{}
		conns.Store(c, pc)
		return context.WithValue(ctx, connKey{}, pc)
	}
	hs.ConnState = func(c net.Conn, state http.ConnState) {
		if state == http.StateClosed || state == http.StateHijacked {
			if pc, ok := conns.LoadAndDelete(c); ok {
				u.drop(pc.(*Conn))
			}
		}
	}
}

// ErrBroke is the error of a conn to an agent, open, that broke before
// its first request was sent.
var ErrBroke = errors.New("upstream: the agent's stream broke before the request")

// exchangeConn is the conn of an upstream: it keeps the agent's refusal,
// whatever dialled it.
type exchangeConn struct {
	net.Conn
	isRefusal func(error) bool
	mu        sync.Mutex
	refused   error
}

func (c *exchangeConn) refusal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// refusalAfter is refusal, once the agent's reply is in, waiting up to d
// for it when the conn is one that reads a reply.
func (c *exchangeConn) refusalAfter(d time.Duration) error {
	if err := c.refusal(); err != nil {
		return err
	}
	r, ok := c.Conn.(interface {
		Replied() <-chan struct{}
		ReadReply() error
	})
	if !ok {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.Replied():
	case <-t.C:
		return nil
	}
	// Read already: ReadReply returns what it said, without reading.
	if err := r.ReadReply(); err != nil && c.isRefusal != nil && c.isRefusal(err) {
		return err
	}
	return nil
}

func (c *exchangeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && c.isRefusal != nil && c.isRefusal(err) {
		c.mu.Lock()
		c.refused = err
		c.mu.Unlock()
	}
	return n, err
}

// Reset cuts the conn short (see reset).
func (c *exchangeConn) Reset() { reset(c.Conn) }

// resetter is a conn that can be cut short rather than closed (a stream
// to an agent, local or relayed).
type resetter interface{ Reset() }

// reset cuts c short when it can, and closes it otherwise.
func reset(c net.Conn) {
	if r, ok := c.(resetter); ok {
		r.Reset()
		return
	}
	c.Close()
}
