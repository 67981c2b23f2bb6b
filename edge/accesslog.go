package edge

import (
	"net/http"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/access"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// endAccess writes the access log line of a request and tells the
// Observer.
func (s *Server) endAccess(a *access.Writer, r *http.Request) {
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	d := time.Since(a.Start)
	status := a.Status
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	s.obs().Request(proto, status, d)
	s.obs().Bytes(proto, a.In.Load(), a.Out.Load())
	if s.AccessLog != nil {
		s.logAccess(a, r, status, d)
	}
}

// logAccess writes the access log line of a request.
func (s *Server) logAccess(a *access.Writer, r *http.Request, status int, d time.Duration) {
	attrs := []any{
		"method", wire.Printable(r.Method, 32),
		"host", wire.Printable(r.Host, 256),
		"path", wire.Printable(r.URL.Path, 256),
		"proto", r.Proto,
		"status", status,
		"bytes", a.Out.Load(),
		"duration", d.Round(time.Microsecond),
		"client", r.RemoteAddr,
	}
	if code := a.Header().Get("Tunnelkit-Error"); code != "" {
		// The edge's answer, or an agent's forwarder's: its request ID
		// finds the detail in the edge's log or in the agent's.
		attrs = append(attrs, "error", code, "request_id", wire.Printable(a.Header().Get(headerRequestID), 64))
	}
	s.AccessLog.Info("http", attrs...)
}
