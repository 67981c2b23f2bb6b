package proxyproto

import (
	"errors"
	"net"
	"os"
)

// The errors of this package. Errors returned by Read wrap one of them (check
// with errors.Is), or wrap io.EOF, io.ErrUnexpectedEOF or the reader's own
// error, as Read documents; errors returned when writing a header wrap
// ErrInvalidHeader or the writer's error.
var (
	// ErrNoProxyHeader means the stream does not start with a PROXY header:
	// its first bytes differ from both the version 1 signature ("PROXY ",
	// upper case, with its space) and the 12-byte version 2 signature. Read
	// decides it on the first byte that differs, without waiting for more,
	// and consumes nothing: "GET /", a TLS record (0x16) or an SSH banner
	// fail at once, on their first byte.
	ErrNoProxyHeader = errors.New("proxyproto: no PROXY protocol header")

	// ErrMalformed means the stream starts with a PROXY signature but the
	// header after it is not valid: for version 1, no CRLF within 107 bytes,
	// a wrong number of fields, an address that is not a valid IP of the
	// stated family, a port that is not a decimal number from 0 to 65535; for
	// version 2, a version other than 2, an unknown command or family, an
	// address block shorter than its family needs, a truncated TLV.
	ErrMalformed = errors.New("proxyproto: malformed PROXY protocol header")

	// ErrInvalidHeader means a Header cannot be written: a Version other than
	// 1 or 2, an unknown Command, TLVs in a version 1 header, or a version 2
	// header longer than its 16-bit length field allows.
	ErrInvalidHeader = errors.New("proxyproto: invalid header to write")

	// ErrUntrustedHeader means a conn from a peer that Listener.Trusted does
	// not trust started with a PROXY signature: a client trying to choose
	// the address it appears to come from, or a proxy missing from Trusted.
	// A Listener closes such conns when RejectUntrustedHeaders is set.
	ErrUntrustedHeader = errors.New("proxyproto: PROXY header from a peer not trusted to send one")

	// ErrTimeout is returned when a read deadline passes before the header
	// is complete. It is a net.Error whose Timeout method reports true, and
	// errors.Is(ErrTimeout, os.ErrDeadlineExceeded) holds.
	ErrTimeout net.Error = timeoutError{}
)

// timeoutError is the type of ErrTimeout.
type timeoutError struct{}

func (timeoutError) Error() string   { return "proxyproto: timed out reading the PROXY protocol header" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// Is makes errors.Is(ErrTimeout, os.ErrDeadlineExceeded) hold, as it does for
// the read errors of a net.Conn whose deadline passed.
func (timeoutError) Is(target error) bool { return target == os.ErrDeadlineExceeded }
