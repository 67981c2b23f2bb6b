// Package access measures an HTTP response for the edge's access log and
// its Observer: the status the client got, and the bytes each way.
package access

import (
	"net/http"
	"sync/atomic"
	"time"
)

// Writer wraps a handler's http.ResponseWriter and keeps what an access
// log line says of the response.
type Writer struct {
	http.ResponseWriter
	Start  time.Time
	Status int          // the final status written; 101 for a switched protocol
	Out    atomic.Int64 // bytes of the response body (or upgraded connection) to the client
	In     atomic.Int64 // bytes of the request body (or upgraded connection) from the client
}

// NewWriter wraps w, from now. The request's body is counted by whoever
// reads it, into In: the request itself is left alone (net/http's server
// looks at its Body after the handler, to tell a body closed early, which
// makes it linger before closing the connection, from one it may drain).
func NewWriter(w http.ResponseWriter) *Writer {
	return &Writer{ResponseWriter: w, Start: time.Now()}
}

// WriteHeader keeps the first final status (informational ones pass).
func (a *Writer) WriteHeader(code int) {
	if a.Status == 0 && code >= 200 {
		a.Status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *Writer) Write(p []byte) (int, error) {
	if a.Status == 0 {
		a.Status = http.StatusOK
	}
	n, err := a.ResponseWriter.Write(p)
	a.Out.Add(int64(n))
	return n, err
}

// Upgraded notes a switched protocol: ReverseProxy writes the 101 on the
// hijacked connection, past the ResponseWriter.
func (a *Writer) Upgraded() { a.Status = http.StatusSwitchingProtocols }

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines, hijacking).
func (a *Writer) Unwrap() http.ResponseWriter { return a.ResponseWriter }
