package agent

import (
	"context"
	"errors"
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
	// a limit reached, a restart under way); trying again later may work.
	ErrUnavailable = errors.New("agent: edge unavailable")
	// ErrRefused: the edge refused the request for another reason (a bad
	// name, an unsupported version); trying again will not help.
	ErrRefused = errors.New("agent: edge refused the request")

	// ErrProxy: the proxy on the way to the edge failed: it could not be
	// reached, refused the tunnel, asked for credentials, closed the
	// connection, answered something other than its protocol, or did not
	// answer in time. The error names the proxy (scheme://host:port, never its
	// credentials) and says what it answered; an error of the edge itself
	// does not wrap ErrProxy.
	ErrProxy = errors.New("agent: proxy failed")
)

// ctxErr returns why ctx ended, if it did, else err.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// refusal is a request the edge refused: it reads as the sentinel of its
// code and the edge's message ("agent: name taken: abc.example.test is
// held by another owner"), and wraps the sentinel, and also when set.
type refusal struct {
	kind error  // the sentinel of the code
	also error  // another sentinel, or nil
	msg  string // the edge's message, printable
}

func (e *refusal) Error() string { return e.kind.Error() + ": " + e.msg }

func (e *refusal) Unwrap() []error {
	if e.also != nil {
		return []error{e.kind, e.also}
	}
	return []error{e.kind}
}
