package edge

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/access"
	"github.com/tunnelkit/tunnelkit/edge/internal/upstream"
	"github.com/tunnelkit/tunnelkit/forwarded"
	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// An exchange is one public HTTP request on its way to an agent's app and
// back, through httputil.ReverseProxy over an upstream (see package upstream).
//
// Every exchange ends, whatever its client, its agent or its app stops
// doing:
//
//   - A client that leaves cancels the app's request: the stream to the
//     agent is reset (for HTTP/2 to the app, the request's HTTP/2 stream),
//     and the agent cancels the request it forwards. HTTP/2 says when a
//     client leaves (RST_STREAM, or the connection goes); HTTP/1.1 says only
//     that the client's side ended, which a client that half-closes after
//     its request also does, still waiting for the answer. Nothing tells
//     the two apart until a byte is sent (to a client that left, the next
//     write fails), so once the side ended the answer is held only while it
//     moves: it is cut when nothing of it came for halfCloseGrace, before
//     its header as in a silent stream (an event stream between events),
//     unless a write waits on the client, which only one still there holds
//     up. A write to the client that fails cuts the exchange at once.
//   - An app that answers before it read the request body gets its answer
//     to the client; the rest of the body is not read (an HTTP/1.1
//     client's connection is closed after the response), and the stream is
//     reset rather than left waiting for the agent to read.
//   - Bytes that stop moving while they are due (a request body the agent
//     does not read, a response body or an upgraded connection that goes
//     silent, a client that stops reading) end the exchange after
//     Timeouts.HTTPIdle; the app's answer is waited for up to
//     Timeouts.ResponseHeader, the client's body Timeouts.Body per read.
//
// No lock is held across a wait for the agent, the app or the client, and
// no close waits behind a stalled write.
type exchange struct {
	srv    *Server
	in     *http.Request // the public request
	routes []router.Route
	info   ConnInfo
	pc     *upstream.Conn // nil: a mounted handler's request
	aw     *access.Writer
	rc     *http.ResponseController
	pol    *policy.Policy // the endpoint's traffic policy; nil: none

	up     *upstream.Upstream
	reused bool              // up carried a request of pc before
	tried  []router.RouteKey // the routes whose agent refused the request's conn
	down   int               // of tried, those whose app is down (ErrAppDown)
	body   *bodyReader       // nil without a body

	ctx    context.Context // the request to the app's; cancel cuts it
	cancel context.CancelFunc

	start    time.Time   // when the exchange began
	activity atomicTime  // when a byte of a body last moved
	header   atomic.Bool // the app's response header came
	idle     *time.Timer

	writing atomic.Int32 // writes to the client under way (clientWriter)

	mu    sync.Mutex  // orders abort and the end: no abort after the handler
	ended bool        // the proxy returned
	cut   bool        // the edge cut the exchange short
	gone  *time.Timer // an HTTP/1.1 client's side ended: checkGone's timer; nil before

	rp httputil.ReverseProxy
}

// halfCloseGrace is how long, once an HTTP/1.1 client's side ended (it
// left, or it half-closed after its request), the app's answer may send
// nothing before its request is cancelled.
const halfCloseGrace = time.Second

// serveExchange proxies r, which pol let through, to the first reachable
// of routes.
func (s *Server) serveExchange(w http.ResponseWriter, r *http.Request, routes []router.Route, info ConnInfo, aw *access.Writer, pol *policy.Policy) {
	// net/http cancels a request's context when its HTTP/1.1 client
	// half-closes the connection, which looks like leaving: the exchange
	// runs on a context of its own, cancelled as described on exchange.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	x := &exchange{srv: s, in: r, routes: routes, info: info, pc: upstream.ConnOf(r), aw: aw, rc: http.NewResponseController(w), pol: pol, ctx: ctx, cancel: cancel, start: time.Now()}
	up, reused, err := s.ups.Get(ctx, routes, info.Host, x.pc, x.dialFor(routes))
	for err != nil && x.failed(err) {
		// The agent refused the conn before the request went out: its app
		// cannot be reached. The pool's next member, if any.
		up, err = s.ups.Dial(ctx, info.Host, x.pc, x.dialFor(x.left()))
	}
	if err != nil {
		reason, msg := ReasonAgentOffline, "the agent of this tunnel cannot be reached"
		switch {
		case x.allDown(err):
			reason, msg = ReasonAppUnhealthy, msgAppUnhealthy
			w.Header().Set("Retry-After", strconv.Itoa(s.retryAfter(routes)))
		case errors.Is(err, errTooManyStreams):
			reason, msg = ReasonAgentBusy, "the agent of this tunnel has no stream free; try again"
		case errors.Is(err, ErrNoEndpoint):
			reason, msg = ReasonNoEndpoint, msgNoEndpoint
		case errors.Is(err, ErrAppUnreachable):
			reason, msg = ReasonAppUnreachable, msgAppUnreachable
		case errors.Is(err, upstream.ErrBroke):
			reason, msg = ReasonAppError, msgAppError
		}
		s.answer(w, r, reason, msg, err, routes[0].VerboseErrors)
		return
	}
	x.up, x.reused = up, reused
	if p, ok := up.Conn().(*proxyStream); ok {
		p.ep.Request() // through this edge to an endpoint of its own
	}
	x.touch()
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		x.body = &bodyReader{ReadCloser: r.Body, rc: x.rc, timeout: s.cfg().body, activity: &x.activity}
		if aw != nil {
			x.body.counted = &aw.In
		}
	}
	stopWatch := context.AfterFunc(r.Context(), x.clientDone)
	x.armIdle()
	x.rp = httputil.ReverseProxy{
		Rewrite:        x.rewrite,
		Transport:      x,
		ModifyResponse: x.modifyResponse,
		ErrorHandler:   x.errorHandler,
		BufferPool:     pipe.ProxyBuffers,
		ErrorLog:       s.proxyLog,
	}
	out := r.WithContext(ctx)
	if x.body != nil {
		out.Body = x.body
	}
	// The end runs even when the proxy aborts the handler (a panic with
	// http.ErrAbortHandler, to reset the client's stream).
	defer func() {
		stopWatch()
		x.stopIdle()
		x.mu.Lock()
		x.ended = true
		cut := x.cut
		if x.gone != nil {
			x.gone.Stop()
		}
		x.mu.Unlock()
		if x.body != nil {
			x.body.end()
		}
		s.ups.Done(x.up, cut || !x.completed())
	}()
	x.rp.ServeHTTP(&clientWriter{ResponseWriter: w, x: x}, out)
}

// gatedBody is the request's body for one attempt (see exchange.gate):
// its reads wait for the agent's word that its app took the conn, when rep
// is set, and fail with the agent's refusal; Close leaves the body to the
// exchange, which may send it on another attempt.
type gatedBody struct {
	b       *bodyReader
	rep     replier       // nil: no wait
	timeout time.Duration // how long to wait for the agent's word; zero: no bound
	stopped chan struct{} // closed when the attempt is over
	read    atomic.Bool   // a read got past the gate
}

func (g *gatedBody) Read(p []byte) (int, error) {
	if rep := g.rep; rep != nil {
		var expired <-chan time.Time
		if g.timeout > 0 {
			t := time.NewTimer(g.timeout)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-rep.Replied():
		case <-g.stopped:
			return 0, errAttemptOver
		case <-expired:
			return 0, errNoVerdict
		}
		if err := rep.ReadReply(); err != nil {
			return 0, err
		}
		g.rep = nil
	}
	g.read.Store(true)
	return g.b.Read(p)
}

// Close does nothing: the exchange ends the body (bodyReader.end).
func (g *gatedBody) Close() error { return nil }

// stop ends the attempt: a read waiting at the gate returns.
func (g *gatedBody) stop() { close(g.stopped) }

// began reports whether the attempt read any of the body.
func (g *gatedBody) began() bool { return g.read.Load() }

var (
	errAttemptOver = errors.New("edge: the request went to another member of the pool")
	errNoVerdict   = errors.New("edge: the agent did not say in time whether its app took the connection")
)

// completed reports whether the exchange ended cleanly for its upstream:
// the request sent whole and the response read whole, so that the
// upstream may carry the connection's next request.
func (x *exchange) completed() bool {
	return x.header.Load() && (x.body == nil || x.body.done())
}

func (x *exchange) touch() { x.activity.store(time.Now()) }

// RoundTrip sends the request on the exchange's upstream: the proxy's
// Transport. When the agent rejects the upstream's conn (its app cannot be
// reached) before any of the request's body was sent, the request goes to
// the pool's next member, each once at most: a member that says when its
// app took a conn (router.Route.Admits) gets the body only then, so that
// it is never lost to one that could not take it.
func (x *exchange) RoundTrip(req *http.Request) (*http.Response, error) {
	for {
		attempt := *req
		var body *gatedBody
		if x.body != nil {
			body = x.gate()
			attempt.Body = body
		}
		resp, err := x.roundTrip(&attempt)
		if body != nil {
			body.stop()
		}
		if err == nil {
			if x.up.Route().Admits && !x.reused {
				x.srv.reached(x.up.Route())
			}
			return resp, nil
		}
		if body != nil && body.began() || x.ctx.Err() != nil || !x.failed(x.up.Refusal()) {
			return nil, err
		}
		up, derr := x.srv.ups.Dial(x.ctx, x.info.Host, x.pc, x.dialFor(x.left()))
		if derr != nil {
			return nil, err // the answer is the first refusal's
		}
		x.swap(up)
	}
}

// swap makes up, just dialled, the exchange's upstream in the place of
// the one that failed, which goes back to the pool to be closed. An
// exchange cut meanwhile (abort) cuts up too.
func (x *exchange) swap(up *upstream.Upstream) {
	x.mu.Lock()
	old := x.up
	x.up, x.reused = up, false
	cut := x.cut
	x.mu.Unlock()
	x.srv.ups.Done(old, true)
	if cut && !up.H2() {
		up.ResetConn()
	}
	if p, ok := up.Conn().(*proxyStream); ok {
		p.ep.Request() // sent to this member's agent too
	}
}

// failed reports whether err is an agent's refusal of a conn (its app
// cannot be reached, or it no longer serves the endpoint) that another
// member of the pool may take instead: it notes the route as failing, and
// keeps it out of left.
func (x *exchange) failed(err error) bool {
	if err == nil || len(x.routes) < 2 || !errors.Is(err, ErrAppUnreachable) && !errors.Is(err, ErrNoEndpoint) {
		return false
	}
	var r router.Route
	if x.up != nil {
		r = x.up.Route()
	} else if failed := upstream.RouteOf(err); failed != nil {
		r = *failed
	} else {
		return false
	}
	x.srv.unreached(r)
	x.tried = append(x.tried, r.Key())
	if errors.Is(err, ErrAppDown) {
		x.down++
	}
	return len(x.left()) > 0
}

// allDown reports whether err, which ended the exchange, says that the
// app of every route tried is down (ErrAppDown): a refusal, or the failed
// dials of a pool's members (an errorList), with those refused before.
func (x *exchange) allDown(err error) bool {
	return x.down == len(x.tried) && everyDown(err)
}

// everyDown reports whether err says that the app is down (ErrAppDown),
// every error of it for a list of the failed dials of a pool's members.
func everyDown(err error) bool {
	if err == nil || !errors.Is(err, ErrAppDown) {
		return false
	}
	if m, ok := err.(interface{ WrappedErrors() []error }); ok {
		for _, e := range m.WrappedErrors() {
			if !errors.Is(e, ErrAppDown) {
				return false
			}
		}
	}
	return true
}

// left returns the routes not tried yet.
func (x *exchange) left() []router.Route {
	var left []router.Route
	for _, r := range x.routes {
		if !slices.Contains(x.tried, r.Key()) {
			left = append(left, r)
		}
	}
	return left
}

// gate returns the request's body for one attempt: read only once the
// upstream's agent said that its app took the conn, for a new upstream of
// a route that says so (router.Route.Admits), at once otherwise.
func (x *exchange) gate() *gatedBody {
	g := &gatedBody{b: x.body, stopped: make(chan struct{})}
	if rep, ok := x.up.Conn().(replier); ok && !x.reused && x.up.Route().Admits {
		g.rep, g.timeout = rep, x.srv.cfg().handshake
	}
	return g
}

// roundTrip sends the request on the exchange's upstream.
func (x *exchange) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := x.up.RoundTrip(req)
	if err != nil && x.reused && x.body == nil && idempotent(req.Method) && x.ctx.Err() == nil && x.up.Refusal() == nil {
		// The agent closed the connection's idle stream as the request
		// went out (its app's keep-alive timeout): nothing was answered,
		// so the request goes again, on a new upstream.
		if up, derr := x.srv.ups.Dial(x.ctx, x.info.Host, x.pc, x.dialFor(x.routes)); derr == nil {
			x.swap(up)
			resp, err = up.RoundTrip(req)
		}
	}
	if err != nil {
		return nil, err
	}
	x.header.Store(true)
	x.touch()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = &upgradedBody{ReadWriteCloser: rwc, x: x}
		}
		return resp, nil
	}
	resp.Body = &responseBody{ReadCloser: resp.Body, x: x}
	return resp, nil
}

func idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return false
}

// rewrite makes the request the app gets: the client's, with exactly one
// hop of forwarding headers, the client's own, and the Host kept.
func (x *exchange) rewrite(pr *httputil.ProxyRequest) {
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = x.up.Route().TunnelID // names what the upstream reaches; never dialled by name
	proto := "http"
	if pr.In.TLS != nil {
		proto = "https"
	}
	forwarded.Rewrite(pr, forwarded.Hop{For: x.info.Client, Proto: proto, Host: pr.In.Host})
	// The outgoing request shares the incoming one's trailer map, which
	// net/http fills when the body ends: ReverseProxy's clone would stay
	// empty, and the app would get the trailers' names without values.
	pr.Out.Trailer = pr.In.Trailer
}

// modifyResponse applies the policy's response headers, and notes what
// the client gets.
func (x *exchange) modifyResponse(resp *http.Response) error {
	x.pol.Response(resp, x.in, x.info.Client.Addr())
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if x.aw != nil {
			x.aw.Upgraded()
		}
		return nil
	}
	if x.body != nil && !x.body.done() && x.in.ProtoMajor == 1 {
		// The app answered before reading the whole body: close the
		// client's connection after the response rather than wait for
		// the rest of a body nobody will read.
		resp.Header.Set("Connection", "close")
	}
	return nil
}

// errorHandler answers a request whose exchange failed, saying on which
// side.
func (x *exchange) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if pipe.UpstreamReset(w, r, x.start, err) {
		// The app reset its request's stream (a gRPC deadline the app saw
		// pass, say): the client's request ends the same way.
		x.srv.log().Debug("http exchange reset by the app", "host", r.Host, "client", r.RemoteAddr, "err", err)
		return
	}
	reason, msg, cause := x.classify(err)
	if x.clientGone() {
		// Nobody reads the answer; what went wrong is the client's doing.
		x.srv.log().Debug("http exchange ended: the client left", "host", r.Host, "client", r.RemoteAddr, "err", cause)
		x.srv.obs().Refused(reason)
		return
	}
	if reason == ReasonAppUnhealthy {
		w.Header().Set("Retry-After", strconv.Itoa(x.srv.retryAfter(x.routes)))
	}
	x.srv.answer(w, r, reason, msg, cause, x.up.Route().VerboseErrors)
}

// defaultRetryAfter is the Retry-After of an answer app_unhealthy when no
// agent of the endpoint said better: the default interval of a health
// check (agent.HealthCheck).
const defaultRetryAfter = 10

// retryAfter returns the seconds after which an endpoint whose members'
// apps are all down may be up again: the least their agents said, for
// those this edge holds, or defaultRetryAfter.
func (s *Server) retryAfter(routes []router.Route) int {
	best := 0
	for _, r := range routes {
		if r.Edge != "" && r.Edge != s.ID {
			continue
		}
		s.mu.Lock()
		ss := s.sessions[r.SessionID]
		s.mu.Unlock()
		if ss == nil {
			continue
		}
		ss.mu.Lock()
		e, _ := ss.endpointLocked(r.TunnelID)
		ss.mu.Unlock()
		if n := e.RetryAfter(); n > 0 && (best == 0 || n < best) {
			best = n
		}
	}
	if best == 0 {
		return defaultRetryAfter
	}
	return best
}

// clientGone reports whether the exchange was cut because its client left.
func (x *exchange) clientGone() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cut && x.in.Context().Err() != nil
}

// over reports whether the proxy returned.
func (x *exchange) over() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ended
}

// The words of the edge's answers for an agent and its app: what
// happened, never why in detail (that is for the logs).
const (
	msgAppUnhealthy   = "the app behind the tunnel is down; try again later"
	msgNoEndpoint     = "the agent no longer serves this tunnel"
	msgAppUnreachable = "the app behind the tunnel cannot be reached"
	msgAppError       = "the app closed the connection without a whole response"
)

// classify returns why an exchange that failed with err failed, and its
// cause: the agent's refusal when there was one, else err.
func (x *exchange) classify(err error) (Reason, string, error) {
	var ne net.Error
	switch refused := x.up.Refusal(); {
	case x.allDown(refused):
		return ReasonAppUnhealthy, msgAppUnhealthy, refused
	case errors.Is(refused, ErrNoEndpoint):
		return ReasonNoEndpoint, msgNoEndpoint, refused
	case refused != nil:
		return ReasonAppUnreachable, msgAppUnreachable, refused
	case x.body != nil && x.body.failed() != nil:
		if errors.As(x.body.failed(), &ne) && ne.Timeout() {
			return ReasonBodyTimeout, "the request body stopped arriving", err
		}
		if errors.Is(x.body.failed(), io.ErrUnexpectedEOF) {
			return ReasonBadRequest, "the request body ended early", err
		}
		return ReasonBadRequest, "malformed request body", err
	case errors.As(err, &ne) && ne.Timeout():
		return ReasonAppTimeout, "the app did not answer in time", err
	case !x.srv.holdsSession(x.up.Route()):
		return ReasonAgentOffline, "the agent of this tunnel went away", err
	}
	return ReasonAppError, msgAppError, err
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

// clientDone runs when the public request's context ends: its client
// left, or (HTTP/1.1) half-closed, or the handler returned.
func (x *exchange) clientDone() {
	if x.in.ProtoMajor >= 2 {
		x.abort() // RST_STREAM, or the connection went
		return
	}
	end := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ended || x.cut {
		return
	}
	x.gone = time.AfterFunc(halfCloseGrace, func() { x.checkGone(end) })
}

// checkGone cuts the exchange of an HTTP/1.1 client whose side ended at
// end, once the app's answer sent nothing for halfCloseGrace since then
// and no write to the client is under way; else it looks again when that
// may be so.
func (x *exchange) checkGone(end time.Time) {
	last := x.activity.load()
	if last.Before(end) {
		last = end
	}
	quiet := time.Since(last)
	if quiet >= halfCloseGrace && x.writing.Load() == 0 {
		x.srv.log().Debug("http exchange: the client's side ended, and its answer stopped; cutting it", "host", x.in.Host, "client", x.in.RemoteAddr, "header", x.header.Load())
		x.abort()
		return
	}
	next := halfCloseGrace - quiet
	if next <= 0 {
		next = halfCloseGrace // a write waits on the client: still there
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.ended && !x.cut {
		x.gone.Reset(next)
	}
}

// abort cuts the exchange short: the app's request is cancelled (the
// stream reset for HTTP/1.1, the request's HTTP/2 stream for h2c), and a
// write to the client that does not move is ended.
func (x *exchange) abort() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cut || x.ended {
		return
	}
	x.cut = true
	if !x.up.H2() {
		x.up.ResetConn()
	}
	x.cancel()
	x.rc.SetWriteDeadline(time.Now())
}

// armIdle starts the exchange's watchdog (see Timeouts.HTTPIdle).
func (x *exchange) armIdle() {
	d := x.srv.cfg().httpIdle
	if d <= 0 {
		return
	}
	var mu sync.Mutex // orders the timer's assignment with its Reset
	check := func() {
		if x.over() {
			return
		}
		since := time.Since(x.activity.load())
		if !x.awaitingAnswer() && since >= d {
			x.srv.log().Debug("http exchange idle; cutting it", "host", x.in.Host, "client", x.in.RemoteAddr, "idle", since.Round(time.Millisecond))
			x.abort()
			return
		}
		next := d - since
		if next <= 0 {
			next = d
		}
		mu.Lock()
		x.idle.Reset(next)
		mu.Unlock()
	}
	mu.Lock()
	x.idle = time.AfterFunc(d, check)
	mu.Unlock()
}

func (x *exchange) stopIdle() {
	if x.idle != nil {
		x.idle.Stop()
	}
}

// awaitingAnswer reports whether the request was sent whole and its
// answer has not begun: the app's time, which Timeouts.ResponseHeader
// bounds.
func (x *exchange) awaitingAnswer() bool {
	return !x.header.Load() && (x.body == nil || x.body.done())
}

// clientWriter is the ResponseWriter the proxy answers the client with:
// it counts the writes under way (see checkGone), and a write or a flush
// that fails cuts the exchange at once: the client is gone. ReverseProxy
// would notice two writes later (it ignores a flush's error, and net/http's
// buffers pass the error on to its next writes only then).
type clientWriter struct {
	http.ResponseWriter
	x *exchange
}

func (w *clientWriter) Write(p []byte) (int, error) {
	w.x.writing.Add(1)
	n, err := w.ResponseWriter.Write(p)
	w.x.writing.Add(-1)
	if err != nil {
		w.x.writeFailed(err)
	}
	return n, err
}

// FlushError flushes what was written to the client (see
// http.ResponseController.Flush).
func (w *clientWriter) FlushError() error {
	w.x.writing.Add(1)
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.x.writing.Add(-1)
	if err != nil {
		w.x.writeFailed(err)
	}
	return err
}

// Unwrap lets http.ResponseController reach the connection (deadlines,
// hijacking).
func (w *clientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeFailed cuts the exchange whose write to the client failed with
// err, unless err is net/http's word on the handler's own doing (a
// ResponseWriter that cannot flush, as a middleware's may be; a body where
// none goes), not on the client.
func (x *exchange) writeFailed(err error) {
	for _, own := range []error{http.ErrNotSupported, http.ErrBodyNotAllowed, http.ErrContentLength, http.ErrHijacked} {
		if errors.Is(err, own) {
			return
		}
	}
	if x.over() {
		return
	}
	x.srv.log().Debug("http exchange: a write to the client failed; cutting it", "host", x.in.Host, "client", x.in.RemoteAddr, "err", err)
	x.abort()
}

// responseBody is a response body of an exchange: reading it is activity.
type responseBody struct {
	io.ReadCloser
	x *exchange
}

func (b *responseBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.x.touch()
	}
	return n, err
}

// upgradedBody is the connection of a switched protocol (a WebSocket):
// bytes either way are activity, and are counted.
type upgradedBody struct {
	io.ReadWriteCloser
	x *exchange
}

func (u *upgradedBody) Read(p []byte) (int, error) {
	n, err := u.ReadWriteCloser.Read(p)
	if n > 0 {
		u.x.touch()
		if u.x.aw != nil {
			u.x.aw.Out.Add(int64(n))
		}
	}
	return n, err
}

func (u *upgradedBody) Write(p []byte) (int, error) {
	n, err := u.ReadWriteCloser.Write(p)
	if n > 0 {
		u.x.touch()
		if u.x.aw != nil {
			u.x.aw.In.Add(int64(n))
		}
	}
	return n, err
}

// bodyReader reads a public request's body with a deadline for each read,
// and keeps the error of the client's side.
type bodyReader struct {
	io.ReadCloser
	rc       *http.ResponseController
	timeout  time.Duration
	activity *atomicTime
	counted  *atomic.Int64 // the bytes read are added to it; nil: not counted

	mu    sync.Mutex
	err   error // the client side's error; io.EOF once read whole
	ended bool  // the handler returned: rc is no longer to be used
}

// end marks the handler's end: the transport's goroutine may still read
// the body (net/http's HTTP/2 client does), but no longer set deadlines
// through the finished handler's ResponseWriter.
func (b *bodyReader) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
}

// deadline sets the read deadline of the request's connection, unless the
// handler returned.
func (b *bodyReader) deadline(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ended {
		b.rc.SetReadDeadline(t)
	}
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		b.deadline(time.Now().Add(b.timeout))
	}
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.activity.store(time.Now())
		if b.counted != nil {
			b.counted.Add(int64(n))
		}
	}
	if err == io.EOF && b.timeout > 0 {
		b.deadline(time.Time{})
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

// atomicTime is a time read and written atomically.
type atomicTime struct{ ns atomic.Int64 }

func (t *atomicTime) store(v time.Time) { t.ns.Store(v.UnixNano()) }
func (t *atomicTime) load() time.Time   { return time.Unix(0, t.ns.Load()) }

// dialFor returns how a new upstream is dialled: to the first reachable
// of routes, its stream header naming info's client and host, within
// Timeouts.Handshake.
func (x *exchange) dialFor(routes []router.Route) upstream.DialFunc {
	return func(ctx context.Context) (net.Conn, router.Route, error) {
		ctx, cancel := context.WithTimeout(ctx, x.srv.cfg().handshake)
		defer cancel()
		return x.srv.dialRoutes(ctx, routes, x.info, x.dialFailed)
	}
}

// dialFailed notes a route that could not be dialled as tried, so that
// the request's next attempt, if any, leaves it out.
func (x *exchange) dialFailed(r router.Route, err error) {
	x.tried = append(x.tried, r.Key())
	if errors.Is(err, ErrAppDown) {
		x.down++
	}
}
