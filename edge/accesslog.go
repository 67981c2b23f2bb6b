package edge

import (
	"net/http"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// accessWriter keeps what an access log line says of a response.
type accessWriter struct {
	http.ResponseWriter
	start  time.Time
	status int
	bytes  int64
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

// logAccess writes the access log line of a request.
func (s *Server) logAccess(a *accessWriter, r *http.Request) {
	status := a.status
	if status == 0 {
		status = http.StatusOK
	}
	attrs := []any{
		"method", wire.Printable(r.Method, 32),
		"host", wire.Printable(r.Host, 256),
		"path", wire.Printable(r.URL.Path, 256),
		"proto", r.Proto,
		"status", status,
		"bytes", a.bytes,
		"duration", time.Since(a.start).Round(time.Microsecond),
		"client", r.RemoteAddr,
	}
	if code := a.Header().Get("Tunnelkit-Error"); code != "" {
		attrs = append(attrs, "error", code)
	}
	s.AccessLog.Info("http", attrs...)
}
