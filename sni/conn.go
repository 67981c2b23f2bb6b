package sni

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A Conn is a net.Conn whose first bytes are a given prefix, followed by the
// bytes of an underlying conn. Peek returns one that replays the bytes it
// read; NewConn makes one with any prefix, for instance a ClientHello that
// replaces the one the client sent.
//
// Reads return the prefix first, without touching the underlying conn (so a
// read deadline does not apply to them), then read the underlying conn. Every
// other method passes through to the underlying conn. Conn is safe for
// concurrent use, as net.Conn requires, although two concurrent readers get
// the bytes in no defined order, as they would on any conn.
//
// Create a Conn with NewConn or Peek: the zero Conn has no underlying conn.
type Conn struct {
	conn net.Conn

	mu     sync.Mutex
	prefix []byte // the bytes not yet returned; nil once all are
}

var (
	_ net.Conn      = (*Conn)(nil)
	_ io.WriterTo   = (*Conn)(nil)
	_ io.ReaderFrom = (*Conn)(nil)
)

// NewConn returns a conn whose first bytes are prefix, followed by the bytes
// of c. NewConn takes ownership of prefix: the caller must not modify it
// afterwards. The returned conn owns c: closing it closes c.
func NewConn(c net.Conn, prefix []byte) *Conn {
	if len(prefix) == 0 {
		prefix = nil
	}
	return &Conn{conn: c, prefix: prefix}
}

// NetConn returns the underlying conn. Reading from it directly skips the
// bytes of the prefix not yet read.
func (c *Conn) NetConn() net.Conn { return c.conn }

// Read reads the prefix, then the underlying conn. A Read that returns bytes
// of the prefix returns no bytes of the underlying conn, so it never blocks.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.prefix != nil {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		if len(c.prefix) == 0 {
			c.prefix = nil
		}
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.conn.Read(p)
}

// WriteTo writes the rest of the prefix to w, then copies the underlying conn
// to w with io.Copy, until EOF or an error. io.Copy calls it, so copying a
// Conn to a *net.TCPConn keeps the kernel's zero-copy paths (splice on Linux)
// for everything after the prefix.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	c.mu.Lock()
	prefix := c.prefix
	c.prefix = nil
	c.mu.Unlock()

	var n int64
	if prefix != nil {
		m, err := w.Write(prefix)
		n = int64(m)
		if err == nil && m < len(prefix) {
			err = io.ErrShortWrite
		}
		if err != nil {
			c.mu.Lock()
			if m < len(prefix) {
				c.prefix = append(prefix[m:len(prefix):len(prefix)], c.prefix...)
			}
			c.mu.Unlock()
			return n, err
		}
	}
	m, err := io.Copy(w, c.conn)
	return n + m, err
}

// ReadFrom copies r to the underlying conn with io.Copy, so copying to a
// Conn over a *net.TCPConn keeps the kernel's zero-copy paths (splice,
// sendfile).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(c.conn, r)
}

// CloseWrite shuts down the writing side of the underlying conn, as
// (*net.TCPConn).CloseWrite does, so the peer reads EOF while this side can
// still read. It returns an error wrapping errors.ErrUnsupported if the
// underlying conn has no CloseWrite method.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("sni: CloseWrite on a %T: %w", c.conn, errors.ErrUnsupported)
}

// Write writes to the underlying conn.
func (c *Conn) Write(p []byte) (int, error) { return c.conn.Write(p) }

// Close closes the underlying conn. Bytes of the prefix not yet read are
// dropped.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.prefix = nil
	c.mu.Unlock()
	return c.conn.Close()
}

// LocalAddr returns the underlying conn's local address.
func (c *Conn) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// RemoteAddr returns the underlying conn's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.conn.RemoteAddr() }

// SetDeadline sets the underlying conn's deadlines.
func (c *Conn) SetDeadline(t time.Time) error { return c.conn.SetDeadline(t) }

// SetReadDeadline sets the underlying conn's read deadline. Bytes of the
// prefix are returned whatever the deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.conn.SetReadDeadline(t) }

// SetWriteDeadline sets the underlying conn's write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.conn.SetWriteDeadline(t) }
