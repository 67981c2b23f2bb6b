package pipe

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// proxyBufferSize is the size of the buffers ProxyBuffers lends.
const proxyBufferSize = 32 << 10

var proxyBuffers = sync.Pool{New: func() any { return new([proxyBufferSize]byte) }}

// ProxyBuffers is an httputil.BufferPool of 32 KiB buffers, the size
// ReverseProxy copies bodies with, shared by every reverse proxy of the
// module. It pools arrays rather than slices, so that Put allocates
// nothing.
var ProxyBuffers proxyBufferPool

type proxyBufferPool struct{}

// Get returns a buffer of 32 KiB.
func (proxyBufferPool) Get() []byte { return proxyBuffers.Get().(*[proxyBufferSize]byte)[:] }

// Put takes back a buffer Get returned; any other is left to the garbage
// collector.
func (proxyBufferPool) Put(b []byte) {
	if len(b) == proxyBufferSize {
		proxyBuffers.Put((*[proxyBufferSize]byte)(b))
	}
}

// UpstreamReset answers a request whose round trip failed because the
// upstream reset its HTTP/2 stream (RST_STREAM): the app cut that one
// request short, as gRPC servers do when a deadline passes. It reports
// whether it did; the caller's own error answer (a 502 page, which a gRPC
// client reads as Unavailable) is for other failures.
//
// The faithful answer cuts the client's request short too. net/http can
// reset a client's stream only with INTERNAL_ERROR (a handler that
// panics with http.ErrAbortHandler), which a gRPC client reads as
// Internal; so a gRPC request gets the status the reset stands for, in a
// Trailers-Only response: DEADLINE_EXCEEDED once its grpc-timeout has
// passed since start, else CANCELLED. Any other request is cut short
// (this panics with http.ErrAbortHandler).
func UpstreamReset(w http.ResponseWriter, r *http.Request, start time.Time, err error) bool {
	if !isStreamReset(err) {
		return false
	}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		panic(http.ErrAbortHandler)
	}
	code, msg := "1", "the app reset the stream" // CANCELLED
	if d, ok := grpcTimeout(r.Header.Get("Grpc-Timeout")); ok && time.Since(start) >= d {
		code, msg = "4", "the app reset the stream: its deadline passed" // DEADLINE_EXCEEDED
	}
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", code)
	h.Set("Grpc-Message", msg)
	w.WriteHeader(http.StatusOK)
	return true
}

// isStreamReset reports whether err is an HTTP/2 stream reset the peer
// sent. net/http's HTTP/2 errors are of unexported types: the message is
// what tells.
func isStreamReset(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "stream error: stream ID") && strings.Contains(msg, "received from peer")
}

// grpcTimeout parses a grpc-timeout header: at most 8 digits and a unit,
// H, M, S, m (milliseconds), u or n.
func grpcTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	unit := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second, 'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}[v[len(v)-1]]
	if unit == 0 {
		return 0, false
	}
	if n > int64(math.MaxInt64/unit) {
		return math.MaxInt64, true // longer than a Duration holds: as good as none
	}
	return time.Duration(n) * unit, true
}
