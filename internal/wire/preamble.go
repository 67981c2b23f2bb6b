package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"golang.ngrok.com/muxado/v2"
)

// Stream windows: the most unread bytes a stream buffers at each end. Both
// ends of a session must use the same window (muxado takes the peer's to be
// its own), so the session preamble settles it before muxado starts.
const (
	DefaultWindow = 256 << 10
	MinWindow     = 64 << 10
	MaxWindow     = 16 << 20
)

// ALPN is the protocol an agent offers in the ALPN extension of its TLS
// ClientHello, and an edge selects: on an edge's public TLS port it tells
// an agent's session from public traffic (docs/PROTOCOL.md, "Transport"). An
// agent port with TLS may select it or no protocol at all.
const ALPN = "tunnelkit/1"

// preambleMagic opens the session preamble in both directions; its last
// byte is the preamble's version.
var preambleMagic = [4]byte{'T', 'K', 'T', '1'}

// ErrPreamble is a session that does not start with a valid preamble.
var ErrPreamble = errors.New("wire: bad session preamble")

// ClampWindow returns the window to ask for or allow given a configured
// value: DefaultWindow for zero, else w bounded to [MinWindow, MaxWindow].
func ClampWindow(w int) uint32 {
	if w == 0 {
		return DefaultWindow
	}
	return uint32(min(max(w, MinWindow), MaxWindow))
}

// WritePreamble writes the session preamble, in one Write: the magic and a
// u32 window. The agent writes the window it wants; the edge answers with
// the window both ends use.
func WritePreamble(w io.Writer, window uint32) error {
	var b [8]byte
	copy(b[:4], preambleMagic[:])
	binary.BigEndian.PutUint32(b[4:], window)
	_, err := w.Write(b[:])
	return err
}

// ReadPreamble reads a session preamble and returns its window. It reads
// at most its 8 bytes, as they arrive, and fails as soon as a byte differs
// from a preamble's magic, without waiting for the others: a peer that is
// not a tunnelkit edge (an HTTP or TLS server) is told apart by its first
// bytes. Every failure is a *PreambleError, which wraps ErrPreamble: the
// magic is wrong, the window outside [MinWindow, MaxWindow], or the input
// ended first (it wraps the read's error too, io.ErrUnexpectedEOF for an
// input that ended within the preamble).
func ReadPreamble(r io.Reader) (uint32, error) {
	var b [8]byte
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if k := min(n, len(preambleMagic)); string(b[:k]) != string(preambleMagic[:k]) {
			return 0, &PreambleError{Got: append([]byte(nil), b[:n]...)}
		}
		if err != nil && n < len(b) {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, &PreambleError{Got: append([]byte(nil), b[:n]...), Err: err}
		}
	}
	w := binary.BigEndian.Uint32(b[4:])
	if w < MinWindow || w > MaxWindow {
		return 0, &PreambleError{Got: append([]byte(nil), b[:]...)}
	}
	return w, nil
}

// PreambleError is a session that did not start with a valid preamble.
type PreambleError struct {
	// Got holds the bytes read: at most 8, up to the first that is not a
	// preamble's.
	Got []byte

	// Err is the read's error when the input ended or failed first (with
	// the bytes read so far a preamble's beginning); nil when the bytes
	// were wrong.
	Err error
}

func (e *PreambleError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("%v: %v", ErrPreamble, e.Err)
	case len(e.Got) == 8 && string(e.Got[:4]) == string(preambleMagic[:]):
		return fmt.Sprintf("%v: window %d outside %d-%d", ErrPreamble, binary.BigEndian.Uint32(e.Got[4:]), MinWindow, MaxWindow)
	}
	return fmt.Sprintf("%v: starts with %q", ErrPreamble, e.Got)
}

// Unwrap returns ErrPreamble, and Err when set.
func (e *PreambleError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrPreamble, e.Err}
	}
	return []error{ErrPreamble}
}

// MuxConfig returns the muxado configuration of a session whose streams
// buffer window bytes, the same at both ends.
func MuxConfig(window uint32) *muxado.Config {
	return &muxado.Config{MaxWindowSize: window, NewFramer: NewFramer}
}
