package h1

import "errors"

// The errors of this package. Conn.Err returns one of them, possibly
// wrapped (check with errors.Is).
var (
	// ErrMalformed means the bytes in one direction are not an HTTP/1.x
	// message where one was due: a bad request or status line, a header
	// line without a colon, an invalid or conflicting Content-Length, a
	// request whose Transfer-Encoding does not end in chunked, a bad chunk
	// size line or chunk terminator.
	ErrMalformed = errors.New("h1: malformed message")

	// ErrTooLarge means a bound was passed: a head or trailer above 1 MiB, a
	// chunk size line above 4 KiB, too many pipelined requests awaiting
	// their responses, or too many bytes held while a request asked for an
	// upgrade that was then refused.
	ErrTooLarge = errors.New("h1: message too large")

	// ErrUnexpectedResponse means a response began while no request was
	// awaiting one, so it cannot be matched to a request. Calling
	// Conn.Request before the copier writes a chunk to the server avoids a
	// race in which a fast server's answer is observed before its request.
	ErrUnexpectedResponse = errors.New("h1: response without a request")

	// ErrTruncated means the server's side ended (Conn.ResponseEOF) in the
	// middle of a response whose end is not the end of the connection.
	ErrTruncated = errors.New("h1: response truncated")
)
