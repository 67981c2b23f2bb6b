package edge

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// exchangeTransport is the http.RoundTripper of the edge's reverse proxy:
// HTTP/1.1 over the exchange's stream (see httpstream.go), which ServeHTTP
// chose for the request, without the pool, the goroutines and the hand-offs
// of an http.Transport.
type exchangeTransport struct {
	// responseHeaderTimeout bounds the wait for the response's header;
	// zero: no bound.
	responseHeaderTimeout time.Duration
}

// errResponseHeaderTimeout is a response header that did not come in time.
var errResponseHeaderTimeout = timeoutError{"edge: timeout awaiting the app's response header"}

type timeoutError struct{ msg string }

func (e timeoutError) Error() string   { return e.msg }
func (e timeoutError) Timeout() bool   { return true }
func (e timeoutError) Temporary() bool { return true }

var _ net.Error = timeoutError{}

func (t exchangeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil, errors.New("edge: a request without its exchange")
	}
	if x.h2 != nil {
		return t.roundTripH2(req, x)
	}
	st, err := x.take()
	if err != nil {
		return nil, err
	}
	// The edge forwards the body as it comes, so the app has nothing to
	// say before it: net/http already answered the client's Expect.
	req.Header.Del("Expect")
	resp, err := t.roundTrip(req, x, st)
	if err != nil && x.reused && x.body == nil && errors.Is(err, io.EOF) && idempotent(req.Method) {
		// The agent closed the connection's idle stream as the request
		// went out (its app's keep-alive timeout): nothing was answered,
		// so the request goes again, on a new stream.
		st.close()
		if st, err2 := x.redial(req.Context()); err2 == nil {
			return t.roundTrip(req, x, st)
		}
	}
	return resp, err
}

func idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return false
}

// roundTrip sends req on st and reads the response's header.
func (t exchangeTransport) roundTrip(req *http.Request, x *exchange, st *clientStream) (*http.Response, error) {
	upgrade := httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade")
	// A stream of a connection the edge serves carries its next requests
	// too; any other carries this request only (or, after a protocol
	// switch, the upgraded connection).
	keep := st.owner != nil && !upgrade
	req.Close = !keep && !upgrade

	// The stream is closed when the response header is late: the read
	// below fails then.
	var late atomic.Bool
	var timer *time.Timer
	if t.responseHeaderTimeout > 0 {
		timer = time.AfterFunc(t.responseHeaderTimeout, func() {
			late.Store(true)
			st.close()
		})
	}
	fail := func(err error) (*http.Response, error) {
		if timer != nil {
			timer.Stop()
		}
		st.close()
		if late.Load() {
			return nil, errResponseHeaderTimeout
		}
		return nil, err
	}

	// Without a body, the request goes in one write; with one, it is
	// written as it arrives while the response is read, so an app that
	// answers before reading all of it (or streams both ways) works. A
	// failed write (the client's body broke, see exchange.body) cuts the
	// stream, so that neither side waits for the rest.
	var wrote chan error
	if req.Body == nil || req.Body == http.NoBody {
		if err := req.Write(st.conn); err != nil {
			return fail(err)
		}
	} else {
		wrote = make(chan error, 1)
		go writeRequest(req, st, wrote)
	}

	var resp *http.Response
	for {
		var err error
		resp, err = http.ReadResponse(st.br, req)
		if err != nil {
			return fail(err)
		}
		// Skip interim responses (100 Continue, 103 Early Hints) but a
		// protocol switch.
		if resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			resp.Body.Close()
			continue
		}
		break
	}
	if timer != nil {
		timer.Stop()
	}
	if late.Load() {
		// The timeout fired as the header came: the stream is closed.
		return fail(errResponseHeaderTimeout)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// ReverseProxy copies both ways through the body.
		resp.Body = &upgradedBody{st: st}
		return resp, nil
	}
	resp.Body = &exchangeBody{ReadCloser: resp.Body, srv: x.srv, x: x, st: st, keep: keep && !resp.Close, wrote: wrote}
	return resp, nil
}

// writeRequest writes req with its body on st, closes st when that fails,
// and says how it went on done. It is a named function so that goroutine
// dumps say what it does.
func writeRequest(req *http.Request, st *clientStream, done chan<- error) {
	err := req.Write(st.conn)
	if err != nil {
		st.close()
	}
	done <- err
}

// exchangeBody is a response body whose Close ends the exchange: the stream
// goes back to its connection when the exchange ended cleanly, and is
// closed otherwise.
type exchangeBody struct {
	io.ReadCloser
	srv   *Server
	x     *exchange
	st    *clientStream
	keep  bool         // the stream may carry the connection's next request
	wrote <-chan error // how writing the request went; nil: it was written
	eof   atomic.Bool  // the body was read whole
	once  sync.Once
}

func (b *exchangeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (b *exchangeBody) Close() error {
	b.once.Do(func() {
		if !b.eof.Load() {
			// Closing the body of net/http reads it to its end first: end
			// the stream before, so that a long body is not drained.
			b.st.close()
			b.ReadCloser.Close()
			return
		}
		b.ReadCloser.Close()
		if b.keep && b.written() && (b.x.body == nil || b.x.body.done()) {
			b.srv.putIdle(b.st)
			return
		}
		b.st.close()
	})
	return nil
}

// written reports whether the request was written whole by now.
func (b *exchangeBody) written() bool {
	if b.wrote == nil {
		return true
	}
	select {
	case err := <-b.wrote:
		return err == nil
	default:
		return false
	}
}

// upgradedBody is the stream of a switched protocol (a WebSocket): reads
// drain what the response's reader buffered first.
type upgradedBody struct{ st *clientStream }

func (u *upgradedBody) Read(p []byte) (int, error) {
	if u.st.br.Buffered() > 0 {
		return u.st.br.Read(p)
	}
	return u.st.conn.Read(p)
}

func (u *upgradedBody) Write(p []byte) (int, error) { return u.st.conn.Write(p) }
func (u *upgradedBody) Close() error                { u.st.close(); return nil }
