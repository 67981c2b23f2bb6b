package edge

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// accessWriter keeps what an access log line and the Observer say of a
// response.
type accessWriter struct {
	http.ResponseWriter
	start  time.Time
	status int
	bytes  int64
	in     atomic.Int64 // bytes of the request body read (by the proxy's writer)
}

// countedBody counts the bytes read from a request body.
type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (a *accessWriter) WriteHeader(code int) {
	if a.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *accessWriter) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	n, err := a.ResponseWriter.Write(p)
	a.bytes += int64(n)
	return n, err
}

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
	s.obs().Bytes(proto, a.in.Load(), a.bytes)
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
		"bytes", a.bytes,
		"duration", d.Round(time.Microsecond),
		"client", r.RemoteAddr,
	}
	if code := a.Header().Get("Tunnelkit-Error"); code != "" {
		attrs = append(attrs, "error", code)
	}
	s.AccessLog.Info("http", attrs...)
}
