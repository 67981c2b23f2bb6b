package edge

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/forwarded"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// ServeHTTP routes a public HTTP request to the agent that bound its Host:
// the Host minus ".<Domain>", case-insensitive, port ignored.
//
// Each request travels to the route looked up for it, on a stream whose
// header names the request's client: a stream belongs to one public
// connection and is reused by its next requests to the same route and Host
// only (see httpstream.go), so the app behind the agent sees the right
// client as each connection's RemoteAddr, and no stream outlives its
// route. The request and
// response stream through (no whole-body buffering); Upgrade requests such
// as WebSocket are passed through. X-Forwarded-For, -Proto and -Host get
// exactly one hop, the client's, and the Host header is kept.
//
// When the edge itself answers, the status says why and the plain-text body
// and the Tunnelkit-Error header carry a short stable code:
//
//	400 bad_request          a malformed request or request body
//	400 missing_host         no Host header
//	404 no_endpoint          no tunnel has that name
//	404 https_only           the name is bound over https only (see RedirectHTTP)
//	408 body_timeout         the request body stopped moving (BodyTimeout)
//	421 misdirected          an HTTP/2 connection reused for a name it cannot serve
//	429 client_limit         the client holds its share of the endpoint (ClientShare)
//	502 agent_offline        no agent of the endpoint could be reached
//	502 app_unreachable      the agent could not connect to its app
//	502 app_error            the app closed the connection without a whole response
//	503 agent_busy           the agent's session is at MaxStreamsPerSession
//	503 routing_unavailable  the router.Router failed
//	504 app_timeout          the app did not answer in time (ResponseHeaderTimeout)
//
// A client that half-closes its connection after its request still gets
// the app's response.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	s.observeHTTP(w, r, false)
}

// serveHTTPS serves the requests of TLS connections the edge terminated
// for https endpoints.
func (s *Server) serveHTTPS(w http.ResponseWriter, r *http.Request) {
	s.observeHTTP(w, r, true)
}

// observeHTTP serves a request, logging and counting it when the Server
// has an AccessLog or an Observer.
func (s *Server) observeHTTP(w http.ResponseWriter, r *http.Request, terminated bool) {
	if s.AccessLog == nil && s.Observer == nil {
		s.serveHTTP(w, r, terminated)
		return
	}
	aw := &accessWriter{ResponseWriter: w, start: time.Now()}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countedBody{ReadCloser: r.Body, n: &aw.in}
	}
	defer s.endAccess(aw, r)
	s.serveHTTP(aw, r, terminated)
}

// serveHTTP routes a request by its Host: to https routes when the edge
// terminated its TLS, else to http routes (https ones first for a request
// that came over TLS the embedder terminated).
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request, terminated bool) {
	host, err := s.routeHost(r.Host)
	switch {
	case errors.Is(err, errMissingHost):
		s.httpError(w, r, http.StatusBadRequest, "missing_host", "the request has no Host header", nil)
		return
	case errors.Is(err, errMalformedHost):
		s.httpError(w, r, http.StatusBadRequest, "bad_request", "malformed Host header", nil)
		return
	case err != nil:
		s.httpError(w, r, http.StatusNotFound, "no_endpoint", "no tunnel at this address", nil)
		return
	}
	var routes []router.Route
	if terminated || r.TLS != nil && s.servesHTTPS() {
		routes, err = s.router().Lookup(r.Context(), wire.ProtoHTTPS, host)
	}
	if err == nil && len(routes) == 0 && !terminated {
		routes, err = s.router().Lookup(r.Context(), wire.ProtoHTTP, host)
	}
	if err != nil {
		s.httpError(w, r, http.StatusServiceUnavailable, "routing_unavailable", "routing is unavailable", err)
		return
	}
	if len(routes) == 0 {
		s.noRoute(w, r, host, terminated)
		return
	}
	client := clientAddr(r.RemoteAddr)
	release, ok := s.acquireShare(routes, client)
	if !ok {
		s.httpError(w, r, http.StatusTooManyRequests, "client_limit", "too many requests from your address to this tunnel", nil)
		return
	}
	defer release()

	// net/http cancels a request's context when its client half-closes the
	// connection, which looks like a close: the exchange must go on and
	// deliver the app's response, so it runs on a context of its own.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	info := ConnInfo{Client: client, Host: r.Host}
	x := &exchange{srv: s, routes: routes, info: info}
	if up := s.sharedH2(clientOf(r), routes, r.Host); up != nil {
		x.st, x.h2, x.reused = up.st, up, true
		x.h2Reserved.Store(true)
	} else {
		dctx, dcancel := context.WithTimeout(ctx, s.handshakeTimeout())
		st, reused, err := s.streamFor(dctx, r, routes, info)
		dcancel()
		if errors.Is(err, errTooManyStreams) {
			s.httpError(w, r, http.StatusServiceUnavailable, "agent_busy", "the agent of this tunnel has no stream free; try again", err)
			return
		}
		if err != nil {
			s.httpError(w, r, http.StatusBadGateway, "agent_offline", "the agent of this tunnel cannot be reached", err)
			return
		}
		x.st, x.reused = st, reused
		if st.route.AppProtocol == wire.AppProtocolH2C {
			if x.h2, err = s.newH2(st); err != nil {
				s.httpError(w, r, http.StatusBadGateway, "agent_offline", "the agent of this tunnel cannot be reached", err)
				return
			}
			x.h2Reserved.Store(true)
		}
	}
	if x.h2 != nil {
		defer func() {
			if x.h2Reserved.Load() {
				x.h2.cc.Release()
			}
		}()
	}
	st := x.st
	st.conn.touch()
	defer x.stopIdle()
	out := r.WithContext(context.WithValue(ctx, exchangeKey{}, x))
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		x.body = &bodyReader{ReadCloser: r.Body, rc: http.NewResponseController(w), timeout: s.bodyTimeout()}
		out.Body = x.body
	}
	s.proxy.rp.ServeHTTP(w, out)
}

// routeHost returns the normalised host name of a Host header that lies
// under the server's domain: errMissingHost for none, errMalformedHost
// for a Host that is no host name at all, and errOtherHost for one that
// names no tunnel (an IP literal, a name outside the domain, the domain
// itself).
func (s *Server) routeHost(hostport string) (string, error) {
	h := hostport
	if h == "" {
		return "", errMissingHost
	}
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", errMalformedHost
		}
		if _, err := netip.ParseAddr(h[1:end]); err != nil {
			return "", errMalformedHost
		}
		return "", errOtherHost
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		port := h[i+1:]
		for j := 0; j < len(port); j++ {
			if port[j] < '0' || port[j] > '9' {
				return "", errMalformedHost
			}
		}
		h = h[:i]
	}
	h, ok := router.Normalise(h)
	if !ok {
		return "", errMalformedHost
	}
	domain, ok := router.Normalise(s.Domain)
	if !ok || !strings.HasSuffix(h, "."+domain) {
		return "", errOtherHost
	}
	return h, nil
}

var (
	errMissingHost   = errors.New("edge: missing host")
	errMalformedHost = errors.New("edge: malformed host")
	errOtherHost     = errors.New("edge: host names no tunnel")
)

func (s *Server) responseHeaderTimeout() time.Duration {
	switch {
	case s.ResponseHeaderTimeout < 0:
		return 0
	case s.ResponseHeaderTimeout == 0:
		return 5 * time.Minute
	}
	return s.ResponseHeaderTimeout
}

func (s *Server) bodyTimeout() time.Duration {
	switch {
	case s.BodyTimeout < 0:
		return 0
	case s.BodyTimeout == 0:
		return defaultBodyTimeout
	}
	return s.BodyTimeout
}

// clientAddr parses an http.Request's RemoteAddr.
func clientAddr(remote string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// httpError answers a request the edge could not route, with the status,
// and the code in a header and in a plain-text body, and logs why.
func (s *Server) httpError(w http.ResponseWriter, r *http.Request, status int, code, msg string, err error) {
	// What a client did wrong is the client's business, and attackers
	// would choose the log's volume: only what went wrong on the edge's or
	// the agent's side is logged at Info.
	level := slog.LevelDebug
	if status >= 500 {
		level = slog.LevelInfo
	}
	s.log().Log(r.Context(), level, "http error", "status", status, "code", code, "host", wire.Printable(r.Host, 256), "client", r.RemoteAddr, "err", err)
	s.obs().Refused(code)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Tunnelkit-Error", code)
	if r.ContentLength != 0 && r.ProtoMajor == 1 {
		// Close rather than read what is left of the body first, as
		// net/http would: a client that sends it slowly, or never, would
		// hold the connection for as long as it likes. (HTTP/2 resets
		// the stream alone; "Connection: close" would end the whole
		// connection, every other stream's too.)
		h.Set("Connection", "close")
	}
	w.WriteHeader(status)
	io.WriteString(w, code+": "+msg+"\n")
}

// exchange is one proxied request: the stream it was sent on, and what went
// wrong on which side.
type exchange struct {
	srv    *Server
	routes []router.Route // the routes looked up for the request
	info   ConnInfo       // its client and Host
	body   *bodyReader    // nil without a body

	h2 *h2Upstream // the HTTP/2 connection to an h2c app it goes on; nil: HTTP/1.1 on st

	h2Reserved atomic.Bool // a request is reserved on h2 and not sent yet

	mu     sync.Mutex
	st     *clientStream
	reused bool // st carried an earlier request of the connection
	taken  bool
	idle   *time.Timer
}

type exchangeKey struct{}

// take hands the exchange's stream to the transport, once.
func (x *exchange) take() (*clientStream, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.taken {
		return nil, errors.New("edge: the request's stream was used already")
	}
	x.taken = true
	return x.st, nil
}

// stream returns the exchange's stream now.
func (x *exchange) stream() *clientStream {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.st
}

// redial replaces a reused stream that turned out closed with a new one.
func (x *exchange) redial(ctx context.Context) (*clientStream, error) {
	ctx, cancel := context.WithTimeout(ctx, x.srv.handshakeTimeout())
	defer cancel()
	conn, route, err := x.srv.dialRoutes(ctx, x.routes, x.info)
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.st = newClientStream(conn, route, x.info.Host, x.st.owner)
	x.reused = false
	return x.st, nil
}

// armIdle closes the exchange's stream once no byte moved either way for
// d: a response body, or an upgraded connection, that went silent.
func (x *exchange) armIdle(d time.Duration) {
	if d <= 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.idle != nil {
		return
	}
	st := x.st
	check := func() {
		if since := st.conn.idle(); since < d {
			x.mu.Lock()
			x.idle.Reset(d - since)
			x.mu.Unlock()
			return
		}
		st.close()
	}
	x.idle = time.AfterFunc(d, check)
}

func (x *exchange) stopIdle() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.idle != nil {
		x.idle.Stop()
	}
}

// classify returns the status, code and message for a failed exchange.
func (x *exchange) classify(s *Server, err error) (int, string, string) {
	var ne net.Error
	st := x.stream()
	switch refused := st.conn.refusal(); {
	case errors.Is(refused, ErrNoEndpoint):
		return http.StatusNotFound, "no_endpoint", "the agent no longer serves this tunnel"
	case refused != nil:
		return http.StatusBadGateway, "app_unreachable", "the app behind the tunnel cannot be reached: " + strings.TrimPrefix(refused.Error(), ErrAppUnreachable.Error()+": ")
	case x.body != nil && x.body.failed() != nil:
		if errors.As(x.body.failed(), &ne) && ne.Timeout() {
			return http.StatusRequestTimeout, "body_timeout", "the request body stopped arriving"
		}
		if errors.Is(x.body.failed(), io.ErrUnexpectedEOF) {
			return http.StatusBadRequest, "bad_request", "the request body ended early"
		}
		return http.StatusBadRequest, "bad_request", "malformed request body"
	case errors.As(err, &ne) && ne.Timeout():
		return http.StatusGatewayTimeout, "app_timeout", "the app did not answer in time"
	case !s.holdsSession(st.route):
		return http.StatusBadGateway, "agent_offline", "the agent of this tunnel went away"
	}
	return http.StatusBadGateway, "app_error", "the app closed the connection without a whole response"
}

// holdsSession reports whether r's session is still open here; true for a
// route held by another edge, which this one cannot tell.
func (s *Server) holdsSession(r router.Route) bool {
	if r.Edge != "" && r.Edge != s.ID {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[r.SessionID] != nil
}

// atomicTime is a time read and written atomically.
type atomicTime struct{ ns atomic.Int64 }

func (t *atomicTime) store(v time.Time) { t.ns.Store(v.UnixNano()) }
func (t *atomicTime) load() time.Time   { return time.Unix(0, t.ns.Load()) }

// exchangeConn is the stream of an exchange: it keeps the time of its last
// byte, and the agent's refusal, whatever the Dialer.
type exchangeConn struct {
	net.Conn
	last    atomicTime
	mu      sync.Mutex
	refused error
}

func (c *exchangeConn) touch()              { c.last.store(time.Now()) }
func (c *exchangeConn) idle() time.Duration { return time.Since(c.last.load()) }

func (c *exchangeConn) refusal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

func (c *exchangeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.touch()
	}
	if err != nil && (errors.Is(err, ErrAppUnreachable) || errors.Is(err, ErrNoEndpoint)) {
		c.mu.Lock()
		c.refused = err
		c.mu.Unlock()
	}
	return n, err
}

func (c *exchangeConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// bodyReader reads a public request's body with a deadline for each read,
// and keeps the error of the client's side.
type bodyReader struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration

	mu  sync.Mutex
	err error // the client side's error; io.EOF once read whole
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.timeout > 0 {
		b.rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

// done reports whether the body was read whole.
func (b *bodyReader) done() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err == io.EOF
}

// failed returns the error that ended the body early, if one did.
func (b *bodyReader) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == io.EOF {
		return nil
	}
	return b.err
}

// httpProxy is the reverse proxy of a Server's public HTTP traffic.
type httpProxy struct {
	srv *Server
	rp  *httputil.ReverseProxy
}

func newHTTPProxy(s *Server) *httpProxy {
	p := &httpProxy{srv: s}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      exchangeTransport{responseHeaderTimeout: s.responseHeaderTimeout()},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
	}
	return p
}

func (p *httpProxy) rewrite(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(exchangeKey{}).(*exchange)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = x.stream().route.TunnelID // names what the stream reaches; never dialled by name
	proto := "http"
	if pr.In.TLS != nil {
		proto = "https"
	}
	forwarded.Rewrite(pr, forwarded.Hop{For: clientAddr(pr.In.RemoteAddr), Proto: proto, Host: pr.In.Host})
	// The outgoing request shares the incoming one's trailer map, which
	// net/http fills when the body ends: ReverseProxy's clone would stay
	// empty, and the app would get the trailers' names without values.
	pr.Out.Trailer = pr.In.Trailer
}

// modifyResponse starts the idle watchdog once the app answered: a
// response body or an upgraded connection that stays silent for IdleTimeout
// is cut.
func (p *httpProxy) modifyResponse(resp *http.Response) error {
	x, _ := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil
	}
	x.armIdle(p.srv.idleTimeout(2 * time.Minute))
	if x.body != nil && !x.body.done() && resp.StatusCode != http.StatusSwitchingProtocols && resp.Request.ProtoMajor == 1 {
		// The app answered before reading the whole body: close the
		// client's connection after the response rather than wait for
		// the rest of a body nobody will read.
		resp.Header.Set("Connection", "close")
	}
	return nil
}

func (p *httpProxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	x := r.Context().Value(exchangeKey{}).(*exchange)
	status, code, msg := x.classify(p.srv, err)
	p.srv.httpError(w, r, status, code, msg, err)
}

// bufferPool lends the 32 KiB buffers ReverseProxy copies bodies with.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
