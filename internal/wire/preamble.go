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

// ReadPreamble reads a session preamble and returns its window. It fails
// with ErrPreamble when the magic is wrong or the window outside
// [MinWindow, MaxWindow].
func ReadPreamble(r io.Reader) (uint32, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrPreamble, err)
	}
	if [4]byte(b[:4]) != preambleMagic {
		return 0, fmt.Errorf("%w: starts with %q", ErrPreamble, b[:4])
	}
	w := binary.BigEndian.Uint32(b[4:])
	if w < MinWindow || w > MaxWindow {
		return 0, fmt.Errorf("%w: window %d outside %d-%d", ErrPreamble, w, MinWindow, MaxWindow)
	}
	return w, nil
}

// MuxConfig returns the muxado configuration of a session whose streams
// buffer window bytes, the same at both ends.
func MuxConfig(window uint32) *muxado.Config {
	return &muxado.Config{MaxWindowSize: window, NewFramer: NewFramer}
}
