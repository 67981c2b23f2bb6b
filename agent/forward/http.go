package forward

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The app protocols of HTTP.AppProtocol, as agent.Endpoint names them.
const (
	appProtocolHTTP1 = "http1"
	appProtocolH2C   = "h2c"
)

// HTTP forwards the HTTP requests that a listener's conns carry to a local
// address, one by one, so that Logger gets one line per request, with its
// method, path, status, bytes and duration, and a Recorder may record
// each.
//
// Each conn gets a connection of its own to To, and its bytes go both ways
// as they come, byte for byte, while a watcher finds each request and
// response in them, for its line and its recording: HTTP/1.1 messages for
// the app protocol http1, HTTP/2 frames (prior knowledge) for h2c. So the
// app gets each request exactly as the edge sent it (the edge has dropped
// the client's hop-by-hop headers, and drops the app's from the response;
// header names keep the case they were sent in), and the edge the app's
// response as the app wrote it; the edge's pool of conns is the pool of
// connections to the app. Host, X-Forwarded-For, -Proto and -Host reach
// the app unchanged, and no header is added. Bodies and trailers stream
// both ways, as do upgraded connections (WebSocket), whose line comes
// when they end.
//
// HTTP answers for the app where the app cannot, in the edge's way: 502,
// a short code in the Tunnelkit-Error header and the plain-text body,
// which says what happened in words, and a request ID in the
// Tunnelkit-Request-Id header and the body, under which Logger's warning
// and the Recorder's recording keep the detail (the dial error, which
// names the app's address): the client sees it only with VerboseErrors.
// When To cannot be reached, each request of the conn is answered 502
// app_unreachable and the conn ends (an h2c connection after its streams
// are answered: GOAWAY), so that the edge's next request comes on a new
// conn, which tries the app again. When the HTTP/1.1 app closes a
// connection before answering its first request, the client gets 502
// app_error; an app that closes a kept-alive connection as a request goes
// out closes the conn instead, as a server closes an idle connection: the
// edge sends an idempotent request again. An h2c app's resets and closes
// reach the edge as the app sent them, and a line for a stream reset
// before its end says reset=true. There is no PROXY protocol header: the
// connections to To are not one client's (the app finds the client in
// X-Forwarded-For); use [Bytes] for one.
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
	// protocol h2c, which is then HTTP/2 over TLS; the bytes that pass,
	// and the watchers that see them, are the same either way. Nil:
	// plaintext.
	TLSConfig *tls.Config

	// AppProtocol is what the conns carry and the app at To speaks:
	// "http1" for HTTP/1.1, "h2c" for HTTP/2 without TLS (prior
	// knowledge). Empty: what the listener's AppProtocol method says when
	// it has one (an *agent.Listener; "" there means http1), else http1.
	AppProtocol string

	// DialTimeout bounds each connection to To. Zero or negative: 10 s.
	DialTimeout time.Duration

	// Logger gets one line per request, when its response has ended. Nil:
	// discarded.
	Logger *slog.Logger

	// VerboseErrors shows the error's detail (the dial error, the app's
	// address, a certificate's) in the 502s that HTTP answers for the
	// app, for development. False: as the listener's VerboseErrors
	// method says, when it has one (an *agent.Listener, whose
	// agent.Endpoint says), else the answers say what happened in words
	// and carry a request ID, under which Logger and Recorder keep the
	// detail.
	VerboseErrors bool

	// Recorder records each request and its response as they pass, and
	// may replay a request (see [Recorder]): an *inspect.Inspector shows
	// them on its page. Nil: none. A nil pointer in a non-nil interface
	// is not nil: set it only to a Recorder that is there.
	Recorder Recorder
}

// Serve accepts l's conns and forwards the requests they carry to h.To
// until l is closed. It returns nil when l is closed (Accept fails with an
// error wrapping net.ErrClosed), and the error of Accept otherwise, after
// closing the conns it still serves and their connections to the app
// (the requests under way end; their recordings end broken off) and
// waiting for them; but for ErrHandedOver, after which it returns nil once
// those conns have ended by themselves. It fails at once for an
// AppProtocol it does not know.
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
	alpn := "http/1.1"
	if proto == appProtocolH2C {
		alpn = "h2"
	}
	app, err := newAppDialer(h.Network, h.To, h.TLSConfig, h.DialTimeout, alpn)
	if err != nil {
		return err
	}
	p := newHTTPProxy(h, proto == appProtocolH2C, app)
	if v, ok := l.(interface{ VerboseErrors() bool }); ok && v.VerboseErrors() {
		p.verbose = true
	}
	err = p.serveConns(l)
	if errors.Is(err, net.ErrClosed) || errors.Is(err, ErrHandedOver) {
		return nil
	}
	return err
}

// httpProxy is the state of one HTTP.Serve: the conns it serves, and
// their connections to the app.
type httpProxy struct {
	to         string
	h2c        bool
	verbose    bool // the 502s it answers show the error (HTTP.VerboseErrors)
	logger     *slog.Logger
	rec        Recorder                  // nil: none
	replayFunc func(*http.Request) error // p.replay, for Record
	app        *appDialer                // connects to the app
	ctx        context.Context           // done when Serve returns
	cancel     context.CancelFunc

	mu     sync.Mutex
	closed bool                  // no new conn or connection to the app
	conns  map[net.Conn]struct{} // the conns served, and their connections to the app
	wg     sync.WaitGroup        // the goroutines that serve conns
}

func newHTTPProxy(h HTTP, h2c bool, app *appDialer) *httpProxy {
	p := &httpProxy{to: h.To, h2c: h2c, verbose: h.VerboseErrors, logger: orDiscard(h.Logger), rec: h.Recorder, app: app, conns: map[net.Conn]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.replayFunc = p.replay
	return p
}

// serveConns serves l's conns, each in a goroutine of its own, until
// l's Accept fails; it returns that error once the conns it still serves
// are closed and their goroutines ended.
func (p *httpProxy) serveConns(l net.Listener) error {
	for {
		c, err := l.Accept()
		if errors.Is(err, ErrHandedOver) {
			p.wg.Wait() // the conns served end by themselves
			p.shutdown()
			return err
		}
		if err != nil {
			p.shutdown()
			return err
		}
		o := origin{client: c.RemoteAddr().String(), ctx: p.ctx}
		if !p.serve(c, func() { p.forwardConn(c, o) }) {
			c.Close()
		}
	}
}

// serve runs f, which serves conn c, in a goroutine of its own, tracking
// c until f returns. It reports false, and does nothing, once the proxy
// is shut down.
func (p *httpProxy) serve(c net.Conn, f func()) bool {
	if !p.track(c) {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.untrack(c)
		f()
	}()
	return true
}

// shutdown closes the conns and connections to the app, and waits for
// the goroutines that serve them. Every recorded request's context is
// done.
func (p *httpProxy) shutdown() {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// track registers c to be closed on shutdown; false once it is shut down.
func (p *httpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *httpProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// isClosed reports whether the proxy is shut down.
func (p *httpProxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// dial connects to the app, for a conn, tracking the connection; the
// caller closes it, then untracks it.
func (p *httpProxy) dial() (net.Conn, error) {
	up, err := p.app.dial(p.ctx, nil)
	if err != nil {
		return nil, err
	}
	if !p.track(up) {
		up.Close()
		return nil, fmt.Errorf("forward: %w", net.ErrClosed)
	}
	return up, nil
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

// The codes and messages of the answers HTTP writes for the app, as the
// edge writes them (edge.ReasonAppError, edge.ReasonAppUnreachable), and
// the header of their request ID.
const (
	codeAppError       = "app_error"
	msgAppError        = "the app closed the connection without a whole response"
	codeAppUnreachable = "app_unreachable"
	msgAppUnreachable  = "the app behind the tunnel cannot be reached"
	headerRequestID    = "Tunnelkit-Request-Id"
)

// appError is an answer HTTP writes for the app, as the edge writes its
// own: the code, what it means in words, and the request ID under which
// the log and the recording keep err, the detail, which the body shows
// only when verbose.
type appError struct {
	code, msg string
	id        string
	err       error
	verbose   bool
}

// newAppError returns the answer of code for err, with a new request ID.
func (p *httpProxy) newAppError(code, msg string, err error) appError {
	return appError{code: code, msg: msg, id: newRequestID(), err: err, verbose: p.verbose}
}

// text is the answer's plain-text body.
func (e appError) text() string {
	s := e.code + ": " + e.msg + "\nrequest id: " + e.id + "\n"
	if e.verbose {
		s += "detail: " + printable(e.err.Error(), 1024) + "\n"
	}
	return s
}

// header returns the header fields of the answer, with a body of n
// bytes: those the edge's own answers have, and Date, which net/http's
// server adds.
func (e appError) header(n int) [][2]string {
	return [][2]string{
		{"Content-Type", "text/plain; charset=utf-8"},
		{"X-Content-Type-Options", "nosniff"},
		{"Tunnelkit-Error", e.code},
		{headerRequestID, e.id},
		{"Date", time.Now().UTC().Format(http.TimeFormat)},
		{"Content-Length", strconv.Itoa(n)},
	}
}

// logAppError warns of the answer e for a request of method and path
// (unescaped), with its ID and detail.
func (p *httpProxy) logAppError(e appError, method, path, client string) {
	p.logger.Warn("http error", "code", e.code, "request_id", e.id, "method", printable(method, 32), "path", printable(path, 256), "client", client, "to", p.to, "err", e.err)
}

// newRequestID returns a new random request ID: 16 hex digits.
func newRequestID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// printable returns s, cut at max bytes, with every byte that is not
// printable ASCII replaced by '?': fit for a log line. It copies only
// when it must.
func printable(s string, max int) string {
	if len(s) > max {
		s = s[:max]
	}
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x7e {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s)
	for j := i; j < len(b); j++ {
		if b[j] < 0x20 || b[j] > 0x7e {
			b[j] = '?'
		}
	}
	return string(b)
}
