package forward

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The client's side of a forwarded request: what it is answered through.

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
