package edge

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// accessWriter keeps what an access log line and the Observer say of a
// response: the status the client got, and the bytes each way.
type accessWriter struct {
	http.ResponseWriter
	start  time.Time
	status int          // the final status written; 101 for a switched protocol
	out    atomic.Int64 // bytes of the response body (or upgraded connection) to the client
	in     atomic.Int64 // bytes of the request body (or upgraded connection) from the client
}

// newAccessWriter wraps w. The request's body is counted by the exchange
// as it reads it: r itself is left alone (net/http's server looks at its
// Body after the handler, to tell a body closed early, which makes it
// linger before closing the connection, from one it may drain).
func newAccessWriter(w http.ResponseWriter) *accessWriter {
	return &accessWriter{ResponseWriter: w, start: time.Now()}
}

func (a *accessWriter) WriteHeader(code int) {
	if a.status == 0 && code >= 200 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *accessWriter) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	n, err := a.ResponseWriter.Write(p)
	a.out.Add(int64(n))
	return n, err
}

// upgraded notes a switched protocol: ReverseProxy writes the 101 on the
// hijacked connection, past the ResponseWriter.
func (a *accessWriter) upgraded() { a.status = http.StatusSwitchingProtocols }

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines, hijacking).
func (a *accessWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// endAccess writes the access log line of a request and tells the
// Observer.
func (s *Server) endAccess(a *accessWriter, r *http.Request) {
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	d := time.Since(a.start)
	status := a.status
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	s.obs().Request(proto, status, d)
	s.obs().Bytes(proto, a.in.Load(), a.out.Load())
	if s.AccessLog != nil {
		s.logAccess(a, r, status, d)
	}
}

// logAccess writes the access log line of a request.
func (s *Server) logAccess(a *accessWriter, r *http.Request, status int, d time.Duration) {
	attrs := []any{
		"method", wire.Printable(r.Method, 32),
		"host", wire.Printable(r.Host, 256),
		"path", wire.Printable(r.URL.Path, 256),
		"proto", r.Proto,
		"status", status,
		"bytes", a.out.Load(),
		"duration", d.Round(time.Microsecond),
		"client", r.RemoteAddr,
	}
	if code := a.Header().Get("Tunnelkit-Error"); code != "" {
		attrs = append(attrs, "error", code)
	}
	s.AccessLog.Info("http", attrs...)
}
