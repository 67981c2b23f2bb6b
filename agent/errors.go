package agent

import (
	"context"
	"errors"
	"time"
)

// Errors of the agent. Errors from the edge wrap one of these, so callers
// can tell them apart with errors.Is.
var (
	// ErrUnauthorized: the edge refused the hello: it refused the token,
	// or it wants one and the client has none (ErrNoToken too). The
	// error says which, in the edge's words.
	ErrUnauthorized = errors.New("agent: unauthorized")
	// ErrNoToken: the edge wants a token and the client sent none
	// (Client.Token is empty). An error that wraps it wraps
	// ErrUnauthorized too.
	ErrNoToken = errors.New("agent: no token")
	// ErrNameTaken: the name belongs to another identity, or is bound
	// already by this one without a pool (see Endpoint.Pool).
	ErrNameTaken = errors.New("agent: name taken")
	// ErrUnavailable: the edge cannot grant the request now (no free port,
	// a limit reached, a restart under way); trying again later may work,
	// and Listen does, within its context.
	ErrUnavailable = errors.New("agent: edge unavailable")
	// ErrRefused: the edge refused the request for another reason (a bad
	// name, an unsupported version); trying again will not help.
	ErrRefused = errors.New("agent: edge refused the request")
	// ErrEnded: the edge ended the session, and said why (its operator
	// disconnected the identity, say): a Disconnected event's Err wraps
	// it, with the edge's words.
	ErrEnded = errors.New("agent: the edge ended the session")
	// ErrUnsupported: the edge speaks an older protocol, which has not
	// what the request needs (Listener.Update: version 5).
	ErrUnsupported = errors.New("agent: the edge does not support this")

	// ErrNotAgentPort: the edge's address answered in another protocol
	// than the agent's: an HTTP server (most often the edge's public HTTP
	// or TLS port, where its agent port was meant), or bytes that start no
	// session. The error says what answered.
	ErrNotAgentPort = errors.New("agent: not an edge's agent port")
	// ErrTLSExpected: the edge speaks TLS on its agent port, and the
	// client spoke plaintext to it (Client.Plaintext, or an edge on
	// loopback without Client.TLSConfig).
	ErrTLSExpected = errors.New("agent: the edge expects TLS")
	// ErrPlaintextExpected: the edge speaks plaintext on its agent port,
	// and the client spoke TLS to it.
	ErrPlaintextExpected = errors.New("agent: the edge expects plaintext")

	// ErrProxy: the proxy on the way to the edge failed: it could not be
	// reached, refused the tunnel, asked for credentials, closed the
	// connection, answered something other than its protocol, or did not
	// answer in time. The error names the proxy (scheme://host:port, never its
	// credentials) and says what it answered; an error of the edge itself
	// does not wrap ErrProxy. A proxy that cannot be reached, or that
	// answers that it cannot reach the edge (502, 503, 504), is tried
	// again as an edge that cannot be reached is; the others end Listen.
	ErrProxy = errors.New("agent: proxy failed")
)

// ctxErr returns why ctx ended, if it did, else err.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// sentinelError is an error of a kind that a sentinel names: it reads as
// the sentinel and a message ("agent: name taken: abc.example.test is held
// by another owner", the edge's words for a request it refused), and wraps
// the sentinel, and also when set.
type sentinelError struct {
	kind  error     // the sentinel
	also  error     // another sentinel, or nil
	msg   string    // what happened, printable
	until time.Time // see KeptUntil
}

// KeptUntil returns, for an ErrNameTaken refusal of a name that the edge
// keeps for the identity that held it (the grace after its session ended,
// or after the edge's restart), when that keeping ends: the name is free
// then, unless its holder binds it again. Zero for any other error, and
// when the edge did not say.
func KeptUntil(err error) time.Time {
	var e *sentinelError
	if errors.As(err, &e) && e.kind == ErrNameTaken {
		return e.until
	}
	return time.Time{}
}

func (e *sentinelError) Error() string { return e.kind.Error() + ": " + e.msg }

func (e *sentinelError) Unwrap() []error {
	if e.also != nil {
		return []error{e.kind, e.also}
	}
	return []error{e.kind}
}
