package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// serveHTTP is Serve with f.HTTP: an http.Server over l whose handler
// forwards each request to f.To with a reverse proxy.
func (f *Forwarder) serveHTTP(l net.Listener) error {
	if f.ProxyProtocol != 0 {
		return errors.New("agent: Forwarder.ProxyProtocol with HTTP: requests reach the app over pooled connections that no one client owns, so a PROXY header could not name the client (the app finds it in X-Forwarded-For)")
	}
	proto := f.AppProtocol
	if proto == "" {
		if ap, ok := l.(interface{ AppProtocol() string }); ok {
			proto = ap.AppProtocol()
		}
	}
	if proto == "" {
		proto = wire.AppProtocolHTTP1
	}

	p := newHTTPProxy(f, proto)
	ctx, cancel := context.WithCancel(context.Background())
	p.ctx = ctx
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(proto == wire.AppProtocolH2C)
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
	err := srv.Serve(l)
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

// httpProxy is the handler of Forwarder's HTTP mode: a ReverseProxy to
// the app that logs each request.
type httpProxy struct {
	to        string
	logger    *slog.Logger
	insp      *Inspector      // nil: none
	ctx       context.Context // done when Serve returns
	rp        httputil.ReverseProxy
	transport *http.Transport

	mu       sync.Mutex
	closed   bool                  // no new request or connection to the app
	handlers sync.WaitGroup        // running ServeHTTP calls
	upstream map[*appConn]struct{} // open connections to the app
}

func newHTTPProxy(f *Forwarder, proto string) *httpProxy {
	p := &httpProxy{to: f.To, logger: f.Logger, insp: f.Inspector, upstream: map[*appConn]struct{}{}}
	if p.logger == nil {
		p.logger = discard
	}
	timeout := f.DialTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	dialer := &net.Dialer{Timeout: timeout}
	var protos http.Protocols
	if proto == wire.AppProtocolH2C {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	p.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err}
			}
			limitAppBuffers(c)
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
	return p
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
	pr.Out.URL.Host = p.to
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
		rec := p.insp.begin(p, w, r)
		defer rec.end()
		lw.ResponseWriter = rec
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
	d := time.Since(start)
	if d < 10*time.Millisecond {
		d = d.Round(time.Microsecond)
	} else {
		d = d.Round(time.Millisecond)
	}
	status, n := w.status, w.bytes
	if w.up != nil {
		n = w.up.n.Load()
	}
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	p.logger.LogAttrs(r.Context(), slog.LevelInfo, "http",
		slog.String("method", printable(r.Method, 32)),
		slog.String("path", printable(r.URL.Path, 256)),
		slog.Int("status", status),
		slog.Int64("bytes", n),
		slog.Duration("duration", d),
		slog.String("client", r.RemoteAddr))
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
	code, msg := "app_error", "the app closed the connection without a whole response"
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
	io.WriteString(w, code+": "+msg+": "+wire.Printable(err.Error(), 1024)+"\n")
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
		return nil, fmt.Errorf("agent: %w", net.ErrClosed)
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

// loggingWriter is the ResponseWriter a request is answered through: it
// notes the status and counts the body's bytes for the request's line.
type loggingWriter struct {
	http.ResponseWriter
	start  time.Time     // when the request arrived
	status int           // the final status; 0 until written
	bytes  int64         // the response body's bytes written
	sized  bool          // the response has a Content-Length
	up     *upgradedConn // the client's connection, after a protocol switch

	app atomic.Pointer[appConn] // the connection to the app, for an upgrade
}

// WriteHeader passes informational (1xx) headers on, and notes the final
// status.
func (w *loggingWriter) WriteHeader(code int) {
	if w.status == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		w.status = code
		// The server would add what the app left out.
		h := w.ResponseWriter.Header()
		if _, ok := h["Content-Type"]; !ok {
			h["Content-Type"] = nil
		}
		if _, ok := h["Date"]; !ok {
			h["Date"] = nil
		}
		_, w.sized = h["Content-Length"]
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *loggingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// FlushError sends what was written so far, for http.ResponseController.
//
// ReverseProxy flushes the header of a streamed response (one of unknown
// length) at once and then each write. The header of a response with a
// Content-Length waits for the body's first bytes instead: in one write
// with them, rather than a write, and a packet, of its own.
func (w *loggingWriter) FlushError() error {
	if w.sized && w.bytes == 0 {
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands over the client's connection after the app switched
// protocols, counting the app's bytes to the client.
func (w *loggingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	w.up = &upgradedConn{Conn: c, app: w.app.Load(), done: make(chan struct{})}
	if brw.Reader.Buffered() > 0 {
		w.up.buffered = brw.Reader
	}
	return w.up, brw, nil
}

// Unwrap gives http.ResponseController the server's ResponseWriter.
func (w *loggingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// upgradedConn is a client's connection after a protocol switch.
//
// ReverseProxy copies both ways and ends both when one side ends, unless
// the other side can half-close, which the app's side cannot as
// ReverseProxy sees it. So upgradedConn half-closes the app's side itself
// when the client's ends, and reports that end to ReverseProxy only once
// the app's side has ended too: the bytes still on their way, both ways,
// arrive, as without HTTP.
type upgradedConn struct {
	net.Conn
	app      *appConn      // the app's side; nil: unknown
	buffered *bufio.Reader // the client's bytes that the server read ahead; nil once read
	n        atomic.Int64  // bytes written

	done     chan struct{} // closed when the app's side ended: CloseWrite or Close
	doneOnce sync.Once
}

// Read returns the bytes the server read ahead first: ReverseProxy reads
// the connection only.
func (c *upgradedConn) Read(b []byte) (int, error) {
	var (
		n   int
		err error
	)
	if r := c.buffered; r != nil {
		n, err = r.Read(b)
		if r.Buffered() == 0 {
			c.buffered = nil
		}
	} else {
		n, err = c.Conn.Read(b)
	}
	if err == io.EOF && c.app != nil && c.app.CloseWrite() == nil {
		<-c.done
	}
	return n, err
}

func (c *upgradedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// CloseWrite half-closes the connection when it can: the app's end of
// stream reaches the client while the client may still send.
func (c *upgradedConn) CloseWrite() error {
	defer c.end()
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *upgradedConn) Close() error {
	c.end()
	return c.Conn.Close()
}

func (c *upgradedConn) end() { c.doneOnce.Do(func() { close(c.done) }) }

// printable is wire.Printable without a copy for the common string that
// needs no change.
func printable(s string, max int) string {
	if len(s) <= max {
		i := 0
		for i < len(s) && s[i] >= 0x20 && s[i] <= 0x7e {
			i++
		}
		if i == len(s) {
			return s
		}
	}
	return wire.Printable(s, max)
}
