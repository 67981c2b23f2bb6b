package h2

import "errors"

// The errors of this package. Conn.Err returns one of them, possibly
// wrapped (check with errors.Is).
var (
	// ErrMalformed means the bytes in one direction are not HTTP/2 where
	// they were due: a bad client preface, a first frame other than
	// SETTINGS, a frame of the wrong length for its type or on the wrong
	// stream (a DATA or HEADERS frame on stream 0, a SETTINGS frame on
	// another), a CONTINUATION that continues no header block, a header
	// block HPACK cannot decode, a response without a valid :status, or a
	// response on a stream the client has not opened (calling
	// Conn.Request before the copier writes a chunk to the server avoids
	// a race in which a fast server's answer is observed before its
	// request).
	ErrMalformed = errors.New("h2: malformed frame")

	// ErrTooLarge means a bound was passed: a frame longer than its
	// receiver's SETTINGS_MAX_FRAME_SIZE, a header block above 1 MiB, a
	// dynamic table size update above 1 MiB, or more than 10,000 streams
	// open at once.
	ErrTooLarge = errors.New("h2: frame too large")
)
