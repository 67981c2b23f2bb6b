package edge

import "errors"

// Errors of the edge, to check with errors.Is.
var (
	// ErrNoSession: the agent session of a route is not held by this
	// edge (it ended, or another edge holds it).
	ErrNoSession = errors.New("edge: agent session not found")
	// ErrServerClosed: the Server was closed or shut down.
	ErrServerClosed = errors.New("edge: server closed")
	// ErrAppUnreachable: the agent could not hand a connection to its app
	// (its dial failed); the conn from DialRoute reports it on Read.
	ErrAppUnreachable = errors.New("edge: the agent could not reach its app")
	// ErrNoEndpoint: the agent no longer serves the endpoint a connection
	// was sent to (its listener was closed).
	ErrNoEndpoint = errors.New("edge: the agent no longer serves the endpoint")
)
