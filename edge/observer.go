package edge

import "time"

// Observer hears what happens on an edge, to count it: package
// github.com/tunnelkit/tunnelkit/metrics turns it into Prometheus metrics.
// Its methods are called on the request path, from many goroutines at
// once: they must be cheap and safe for concurrent use, and must not block.
//
// Protocols are "http" (plain HTTP requests and connections), "https"
// (HTTP over TLS the edge terminated), "tls" (TLS passed through) and
// "tcp". Refusal reasons are the bounded set of Reason constants.
type Observer interface {
	// Session is called with +1 when an agent's hello is accepted, and -1
	// when that session ends.
	Session(delta int)
	// Endpoint is called with +1 when an agent binds an endpoint of proto,
	// and -1 when it goes.
	Endpoint(proto string, delta int)
	// Stream is called with +1 when a stream to or from an agent opens,
	// and -1 when it closes.
	Stream(delta int)
	// Conn is called when a public connection of proto is accepted.
	Conn(proto string)
	// Bytes is called when a public TLS or TCP connection ends, and when
	// an HTTP request ends, with the bytes that went from the client to
	// the agent (in) and back (out): for HTTP, the bodies.
	Bytes(proto string, in, out int64)
	// Request is called when an HTTP request ends, with the status sent
	// (200 for a handler that wrote nothing, as net/http sends) and how
	// long it took.
	Request(proto string, status int, d time.Duration)
	// Refused is called when the edge refuses an agent, a connection or a
	// request, with the reason.
	Refused(reason Reason)
}

// HealthObserver is implemented by Observers that count the endpoints
// whose app is down, as their agent's health check said (see
// agent.HealthCheck): EndpointDown is called with true when an
// endpoint's app went down (or was bound, checked, and not reported up
// yet: then at its first report, if that says down), and with false when
// it came up again. It must be cheap and must not block.
type HealthObserver interface {
	EndpointDown(proto string, down bool)
}

// nopObserver is the Observer of a Server without one.
type nopObserver struct{}

func (nopObserver) Session(int)                        {}
func (nopObserver) Endpoint(string, int)               {}
func (nopObserver) Stream(int)                         {}
func (nopObserver) Conn(string)                        {}
func (nopObserver) Bytes(string, int64, int64)         {}
func (nopObserver) Request(string, int, time.Duration) {}
func (nopObserver) Refused(Reason)                     {}
