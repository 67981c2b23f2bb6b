package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/tunnelkit/tunnelkit/agent/inspect"
	"github.com/tunnelkit/tunnelkit/internal/pipe"
)

// The app protocols of HTTP.AppProtocol, as agent.Endpoint names them.
const (
	appProtocolHTTP1 = "http1"
	appProtocolH2C   = "h2c"
)

// HTTP forwards the HTTP requests that a listener's conns carry to a local
// address, one by one, so that Logger gets one line per request, with its
// method, path, status, bytes and duration.
//
// Each conn gets a connection of its own to To, and its bytes go both ways
// as they come, byte for byte, while a watcher finds each request and
// response in them for its line: HTTP/1.1 messages for the app protocol
// http1, HTTP/2 frames (prior knowledge) for h2c. So the app gets each
// request exactly as the edge sent it (the edge has dropped the client's
// hop-by-hop headers, and drops the app's from the response), and the edge
// the app's response as the app wrote it; the edge's pool of conns is the
// pool of connections to the app. With an Inspector, and for a conn whose
// app cannot be reached, an http.Server reads the requests instead
// (HTTP/2 with prior knowledge for h2c) and an httputil.ReverseProxy
// forwards each to To over pooled connections: the app gets each request
// less the hop-by-hop headers, header names in canonical case.
//
// Either way, Host (unless the Host field sets another), X-Forwarded-For,
// -Proto and -Host reach the app unchanged, and no header is added. Bodies and trailers stream both
// ways, as do upgraded connections (WebSocket), whose line comes when
// they end. When To cannot be reached, the client gets 502 with
// Tunnelkit-Error app_unreachable, as from the edge; 502 app_error when
// the HTTP/1.1 app closes without a whole response (an app that closes a
// kept-alive connection as a request goes out closes the conn instead, as
// a server closes an idle connection: the edge sends an idempotent request
// again). An h2c app's resets and closes reach the edge as the app sent
// them, and a line for a stream reset before its end says reset=true.
// There is no PROXY protocol header: the connections to To are not one
// client's (the app finds the client in X-Forwarded-For); use [Bytes] for
// one.
//
// Its zero value with To set is ready to use; it holds no state, so one
// HTTP may serve several listeners at once.
type HTTP struct {
	// To is the local address the requests are forwarded to,
	// "127.0.0.1:3000", or the path of a Unix socket (see Network).
	To string

	// Network is To's network: "tcp", or "unix" for a Unix socket's
	// path. Empty: "tcp".
	Network string

	// TLSConfig, when not nil, makes the connections to To speak TLS (an
	// app that serves https), the app's certificate checked as the config
	// says: against its RootCAs (nil: the system's roots), for its
	// ServerName (empty: To's host, a name or an IP address). Its
	// NextProtos, when empty, offer "http/1.1", or "h2" for the app
	// protocol h2c, which is then HTTP/2 over TLS. Nil: plaintext.
	TLSConfig *tls.Config

	// Host, when not empty, is the Host header of every request to the
	// app, in place of the one the client sent (which the app still finds
	// in X-Forwarded-Host, when the edge set it): for an app that answers
	// only to its own name, as ngrok's --host-header does. The requests
	// then go through the ReverseProxy way, as with an Inspector. Empty:
	// the client's Host reaches the app unchanged.
	Host string

	// AppProtocol is what the conns carry and the app at To speaks:
	// "http1" for HTTP/1.1, "h2c" for HTTP/2 without TLS (prior
	// knowledge; the server still takes HTTP/1.1 too). Empty: what the
	// listener's AppProtocol method says when it has one (an
	// *agent.Listener; "" there means http1), else http1.
	AppProtocol string

	// DialTimeout bounds each connection to To. Zero or negative: 10 s.
	DialTimeout time.Duration

	// Logger gets one line per request, when its response has ended. Nil:
	// discarded.
	Logger *slog.Logger

	// Inspector records each request and its response, for its page and
	// API, and replays them to To on request (see [inspect.Inspector]).
	// Nil: none.
	Inspector *inspect.Inspector
}

// Serve accepts l's conns and forwards the requests they carry to h.To
// until l is closed. It returns nil when l is closed (Accept fails with an
// error wrapping net.ErrClosed), and the error of Accept otherwise, after
// closing the conns it still serves, ending the requests under way (their
// contexts are done) and waiting for them, and closing its connections to
// the app. It fails at once for an AppProtocol it does not know.
func (h HTTP) Serve(l net.Listener) error {
	proto := h.AppProtocol
	switch proto {
	case "", appProtocolHTTP1, appProtocolH2C:
	default:
		return fmt.Errorf("forward: app protocol %q: want http1 or h2c", proto)
	}
	if proto == "" {
		if ap, ok := l.(interface{ AppProtocol() string }); ok {
			proto = ap.AppProtocol()
		}
	}
	if proto == "" {
		proto = appProtocolHTTP1
	}

	p, err := newHTTPProxy(h, proto)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.ctx = ctx
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(proto == appProtocolH2C)
	srv := &http.Server{
		Handler:     p,
		Protocols:   &protos,
		BaseContext: func(net.Listener) context.Context { return ctx },
		// A connection the edge cuts short (its client left) cancels its
		// requests, and with them the app's: net/http would notice only
		// when it next reads the connection.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			rn, ok := c.(interface{ AfterReset(func()) func() bool })
			if !ok {
				return ctx
			}
			ctx, cancel := context.WithCancel(ctx)
			rn.AfterReset(cancel)
			return ctx
		},
		ErrorLog: slog.NewLogLogger(p.logger.Handler(), slog.LevelDebug),
	}
	if p.insp == nil && p.host == "" {
		err = p.serveConns(l, srv, proto == appProtocolH2C)
	} else {
		err = srv.Serve(l)
	}
	// Every request's context is done: the proxy closes the app's side of
	// upgraded connections, which srv.Close does not know, and stops
	// waiting for responses.
	cancel()
	srv.Close()
	p.close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// httpProxy is the handler of HTTP.Serve: a ReverseProxy to the app that
// logs each request.
type httpProxy struct {
	to        string
	host      string     // the Host of requests to the app; "": the client's
	app       *appDialer // connects to the app
	logger    *slog.Logger
	insp      *inspect.Inspector // nil: none
	ctx       context.Context    // done when Serve returns
	rp        httputil.ReverseProxy
	transport *http.Transport

	mu       sync.Mutex
	closed   bool                  // no new request or connection to the app
	handlers sync.WaitGroup        // running ServeHTTP calls
	upstream map[*appConn]struct{} // open connections to the app
}

func newHTTPProxy(h HTTP, proto string) (*httpProxy, error) {
	alpn := "http/1.1"
	if proto == appProtocolH2C {
		alpn = "h2"
	}
	app, err := newAppDialer(h.Network, h.To, h.TLSConfig, h.DialTimeout, alpn)
	if err != nil {
		return nil, err
	}
	p := &httpProxy{to: h.To, host: h.Host, app: app, logger: orDiscard(h.Logger), insp: h.Inspector, upstream: map[*appConn]struct{}{}}
	var protos http.Protocols
	if proto == appProtocolH2C {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	p.transport = &http.Transport{
		// To's address whatever the URL's, and TLS when the app speaks
		// it: the transport writes HTTP/1.1, or HTTP/2 with prior
		// knowledge, on the conn either way.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := app.dial(ctx, nil)
			if err != nil {
				return nil, &dialError{err}
			}
			return p.track(c)
		},
		Protocols:           &protos,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		// Wait for the app's 100 Continue, which then reaches the client,
		// before sending a body the client announced with Expect.
		ExpectContinueTimeout: time.Second,
		// The app gets the client's Accept-Encoding, and the client the
		// app's bytes.
		DisableCompression: true,
	}
	p.rp = httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: p.transport,
		// Flush what the app flushed, as ReverseProxy does by default (at
		// once for a body of unknown length, and for SSE): flushing the
		// header of any response at once would race the handler's end,
		// and a gRPC error sent as Trailers-Only (a header that ends the
		// stream) would reach the client as a header and an empty end.
		BufferPool:   pipe.ProxyBuffers,
		ErrorLog:     slog.NewLogLogger(p.logger.Handler(), slog.LevelDebug),
		ErrorHandler: p.proxyError,
	}
	return p, nil
}

// forwardingHeaders are the headers that ReverseProxy's Rewrite mode takes
// from the outgoing request and that the app must get as the edge sent
// them: the edge added the client's hop already.
var forwardingHeaders = [...]string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// rewrite sends the request to the app as it came: Host, query and
// forwarding headers unchanged, and the request trailers that arrive
// after the body.
func (p *httpProxy) rewrite(pr *httputil.ProxyRequest) {
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = p.app.urlHost()
	if p.host != "" {
		pr.Out.Host = p.host
	}
	// Rewrite mode drops query parameters it cannot parse.
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	// Out.Trailer is a copy, and the server fills In.Trailer when the body
	// ends, as the transport reads it.
	pr.Out.Trailer = pr.In.Trailer
	for _, k := range forwardingHeaders {
		if v, ok := pr.In.Header[k]; ok && !httpguts.HeaderValuesContainsToken(pr.In.Header["Connection"], k) {
			pr.Out.Header[k] = v
		}
	}
}

// ServeHTTP forwards r to the app and logs it.
func (p *httpProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		panic(http.ErrAbortHandler)
	}
	defer p.handlers.Done()
	lw := &loggingWriter{ResponseWriter: w, start: time.Now()}
	if r.ProtoMajor == 1 {
		// Let the app answer while the request body still arrives, as
		// it could over the bytes, and as HTTP/2 always can.
		if fd, ok := w.(interface{ EnableFullDuplex() error }); ok {
			fd.EnableFullDuplex()
		}
		if _, ok := r.Header["Upgrade"]; ok {
			// Learn the connection to the app, which an upgrade keeps.
			trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
				if ac, ok := i.Conn.(*appConn); ok {
					lw.app.Store(ac)
				}
			}}
			r = r.WithContext(httptrace.WithClientTrace(r.Context(), trace))
		}
	}
	if p.insp != nil {
		// Beneath lw: the recording sees the status and body as the
		// client does.
		rw, end := p.insp.Record(w, r, p.to, p)
		defer func() {
			// ReverseProxy aborts a response that broke off with a panic,
			// which goes on.
			v := recover()
			end(v != nil)
			if v != nil {
				panic(v)
			}
		}()
		lw.ResponseWriter = rw
	}
	defer p.logRequest(r, lw, lw.start)
	p.rp.ServeHTTP(lw, r)
}

// enter counts a request in, unless the proxy is closed.
func (p *httpProxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.handlers.Add(1)
	return true
}

// logRequest writes r's line: what a web server's access log holds.
func (p *httpProxy) logRequest(r *http.Request, w *loggingWriter, start time.Time) {
	if !p.logger.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	status, n := w.status, w.bytes
	if w.up != nil {
		n = w.up.n.Load()
	}
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	p.logLine(r.Context(), r.Method, r.URL.Path, status, n, start, r.RemoteAddr)
}

// logLine writes a request's line: its method, path (unescaped), status,
// the bytes of its response body, its duration since start, the client,
// and attrs.
func (p *httpProxy) logLine(ctx context.Context, method, path string, status int, bytes int64, start time.Time, client string, attrs ...slog.Attr) {
	if !p.logger.Enabled(ctx, slog.LevelInfo) {
		return
	}
	p.logger.LogAttrs(ctx, slog.LevelInfo, "http", append([]slog.Attr{
		slog.String("method", printable(method, 32)),
		slog.String("path", printable(path, 256)),
		slog.Int("status", status),
		slog.Int64("bytes", bytes),
		slog.Duration("duration", roundDuration(time.Since(start))),
		slog.String("client", client)}, attrs...)...)
}

// proxyError answers a request the app did not answer, as the edge does:
// 502, and a short code in the Tunnelkit-Error header and the plain-text
// body.
func (p *httpProxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	start := time.Now()
	if lw, ok := w.(*loggingWriter); ok {
		start = lw.start
	}
	if pipe.UpstreamReset(w, r, start, err) {
		// The app reset its request's stream: the request ends the same
		// way toward the edge and the client, not with a 502.
		return
	}
	code, msg := "app_error", msgAppError
	var de *dialError
	if errors.As(err, &de) {
		code, msg = "app_unreachable", "the app behind the tunnel cannot be reached"
		err = de.err
	}
	level := slog.LevelWarn
	if r.Context().Err() != nil {
		// The client went away: the app is not to blame.
		level = slog.LevelDebug
	}
	p.logger.Log(r.Context(), level, "http error", "code", code, "method", printable(r.Method, 32), "path", printable(r.URL.Path, 256), "client", r.RemoteAddr, "to", p.to, "err", err)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Tunnelkit-Error", code)
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, errorText(code, msg, err))
}

// msgAppError says what app_error means.
const msgAppError = "the app closed the connection without a whole response"

// errorText is the plain-text body of a 502 the forwarder answers: the
// code, what it means, and the error.
func errorText(code, msg string, err error) string {
	return code + ": " + msg + ": " + printable(err.Error(), 1024) + "\n"
}

// close waits for the running requests, then closes the connections to
// the app. The server's connections are closed, and the requests'
// contexts done, already.
func (p *httpProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.handlers.Wait()
	p.transport.CloseIdleConnections()
	p.mu.Lock()
	conns := make([]*appConn, 0, len(p.upstream))
	for c := range p.upstream {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// track registers a new connection to the app, or closes it when the
// proxy is closed: the transport may finish a dial for a request that
// is gone.
func (p *httpProxy) track(c net.Conn) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, fmt.Errorf("forward: %w", net.ErrClosed)
	}
	ac := &appConn{Conn: c, p: p}
	p.upstream[ac] = struct{}{}
	return ac, nil
}

// appConn is a connection to the app, known to its proxy until closed.
type appConn struct {
	net.Conn
	p    *httpProxy
	once sync.Once
}

func (c *appConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.upstream, c)
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// CloseWrite half-closes the connection: the app reads EOF.
func (c *appConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// dialError is a failure to connect to the app.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }
