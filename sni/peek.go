package sni

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Defaults of a Peeker whose fields are zero.
const (
	// DefaultTimeout bounds how long Peek waits for a complete ClientHello.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxBytes is the most bytes Peek reads looking for a
	// ClientHello: 16 KiB, record headers included.
	DefaultMaxBytes = 16 << 10
)

// firstReadSize is the buffer of Peek's first read: enough for the hellos of
// today's browsers and of Go's post-quantum default (1.5 to 2 KB) in one read,
// small enough to keep per-connection memory low while a client is slow.
const firstReadSize = 4 << 10

// readBuffers holds firstReadSize buffers. Peek reads into one, and keeps
// for its replay only an exact copy of the bytes read, so a peeked conn does
// not hold a mostly empty buffer.
var readBuffers = sync.Pool{New: func() any {
	b := make([]byte, firstReadSize)
	return &b
}}

// A Peeker reads the ClientHello at the start of a conn without consuming it.
// The zero Peeker is ready to use with the defaults; a Peeker is safe for
// concurrent use, and its fields must not change while it is in use.
type Peeker struct {
	// Timeout bounds the time Peek waits for a complete ClientHello, with a
	// read deadline that Peek sets on the conn and clears (sets to the zero
	// time) before it returns, whatever the outcome: a read deadline the
	// caller had set is lost, and must be set again if wanted. If zero,
	// DefaultTimeout (10 s) is used. If negative, Peek neither sets nor
	// clears the read deadline, so a deadline the caller set applies
	// (or none: Peek then waits as long as the client keeps silent).
	Timeout time.Duration

	// MaxBytes is the most bytes Peek reads from the conn looking for a
	// ClientHello, TLS record headers included, so a hello sent in one
	// record can be up to MaxBytes-5 bytes. A hello that needs more fails
	// with ErrTooLarge, as soon as its header shows it. If zero or negative,
	// DefaultMaxBytes (16 KiB) is used.
	MaxBytes int
}

// Peek reads the ClientHello at the start of conn with the zero Peeker, that
// is with the defaults: see Peeker.Peek.
func Peek(conn net.Conn) (*ClientHello, net.Conn, error) {
	var p Peeker
	return p.Peek(conn)
}

// Peek reads from conn until it holds a complete ClientHello, and parses it.
// It reads with blocking reads, so it returns as soon as the bytes decide the
// outcome: on the first byte for a client that does not speak TLS, once the
// last byte of the hello arrives for one that does. It reads at most
// MaxBytes, and may read some bytes past the hello.
//
// The returned conn is never nil, even with an error: it is a *Conn that
// yields every byte Peek read, in order, then the rest of conn, so the caller
// can hand it to a TLS server or backend, or fall back to another protocol,
// without losing a byte. Closing it closes conn. Peek itself never closes
// conn: the caller owns both.
//
// A nil error comes with a non-nil ClientHello; an error, with a nil one.
// The errors, checked with errors.Is:
//   - ErrNotTLS: the first byte is not 0x16 (a TLS handshake record),
//     decided on that byte alone.
//   - ErrMalformed, ErrInvalidName: as for Parse.
//   - ErrTooLarge: a record length above 2^14, or a hello that needs more
//     than MaxBytes.
//   - ErrTimeout (a net.Error whose Timeout method reports true, which also
//     matches os.ErrDeadlineExceeded): the read deadline passed first.
//   - io.EOF: the client closed the conn without sending a byte.
//   - io.ErrUnexpectedEOF: the client closed the conn in the middle of a
//     hello.
//
// Other read errors are returned wrapped. A nil Peeker uses the defaults.
func (p *Peeker) Peek(conn net.Conn) (*ClientHello, net.Conn, error) {
	timeout, maxBytes := DefaultTimeout, DefaultMaxBytes
	if p != nil {
		if p.Timeout != 0 {
			timeout = p.Timeout
		}
		if p.MaxBytes > 0 {
			maxBytes = p.MaxBytes
		}
	}
	if timeout > 0 {
		if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return nil, NewConn(conn, nil), fmt.Errorf("sni: setting the read deadline: %w", err)
		}
		defer conn.SetReadDeadline(time.Time{})
	}

	pooled := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(pooled)
	a := assembler{max: maxBytes}
	hello, got, err := a.read(conn, (*pooled)[:0:min(len(*pooled), maxBytes)])
	prefix := bytes.Clone(got)
	if hello != nil && a.msgAt >= 0 {
		// Raw points into the pooled buffer: point it into the copy.
		hello.Raw = prefix[a.msgAt : a.msgAt+len(hello.Raw) : a.msgAt+len(hello.Raw)]
	}
	return hello, NewConn(conn, prefix), err
}

// read reads from conn into buf, growing it up to a.max bytes, until the
// bytes read make a ClientHello or rule one out. It returns the hello, or
// the error, and the bytes read, in buf or in the buffer that replaced it.
func (a *assembler) read(conn net.Conn, buf []byte) (*ClientHello, []byte, error) {
	for empty := 0; ; {
		if len(buf) == cap(buf) {
			if len(buf) >= a.max {
				return nil, buf, fmt.Errorf("%w: no ClientHello in %d bytes", ErrTooLarge, a.max)
			}
			buf = append(make([]byte, 0, min(2*cap(buf), a.max)), buf...)
		}
		n, err := conn.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			empty = 0
			msg, ferr := a.feed(buf)
			if ferr == nil {
				hello, perr := parseHello(msg)
				if hello != nil {
					hello.RecordVersion = a.version
				}
				return hello, buf, perr
			}
			if ferr != ErrIncomplete {
				return nil, buf, ferr
			}
		}
		if err != nil {
			return nil, buf, readError(err, len(buf))
		}
		if n == 0 {
			if empty++; empty >= 100 { // as io.ReadAtLeast's callers do
				return nil, buf, fmt.Errorf("sni: %w", io.ErrNoProgress)
			}
		}
	}
}

// readError turns the error of a read that left a hello incomplete, after n
// bytes of it, into Peek's error.
func readError(err error, n int) error {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	case errors.Is(err, io.EOF) && n == 0:
		return fmt.Errorf("sni: connection closed before any byte: %w", io.EOF)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("sni: connection closed after %d bytes, inside the ClientHello: %w", n, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("sni: reading the ClientHello: %w", err)
}
