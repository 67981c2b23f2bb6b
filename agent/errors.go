package agent

import (
	"context"
	"errors"
)

// Errors of the agent. Errors from the edge wrap one of these, so callers
// can tell them apart with errors.Is.
var (
	// ErrUnauthorized: the edge refused the token.
	ErrUnauthorized = errors.New("agent: edge refused the token")
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
