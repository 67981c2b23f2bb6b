package proxyproto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A Conn is a conn returned by Listener.Accept: its addresses are those of
// its PROXY header, if it has one that carries them, and its Read returns the
// bytes that follow the header.
//
// Reads return first the bytes the Listener read past the header, without
// touching the underlying conn (so a read deadline does not apply to them),
// then read the underlying conn. Every other method passes through to the
// underlying conn. Conn is safe for concurrent use, as net.Conn requires.
type Conn struct {
	conn          net.Conn
	header        *Header
	local, remote net.Addr

	mu     sync.Mutex
	prefix []byte // bytes read past the header, not yet returned; nil once all are
}

var (
	_ io.WriterTo   = (*Conn)(nil)
	_ io.ReaderFrom = (*Conn)(nil)
)

// newConn returns a Conn over c with header h (nil for none) whose first
// bytes are prefix, which it takes ownership of.
func newConn(c net.Conn, h *Header, prefix []byte) *Conn {
	pc := &Conn{conn: c, header: h, local: c.LocalAddr(), remote: c.RemoteAddr()}
	if h != nil && h.Command == Proxy && h.Source.IsValid() {
		pc.remote = net.TCPAddrFromAddrPort(h.Source)
		pc.local = net.TCPAddrFromAddrPort(h.Destination)
	}
	if len(prefix) > 0 {
		pc.prefix = prefix
	}
	return pc
}

// Header returns the conn's PROXY header, or nil if it had none (or came
// from an untrusted peer, whose bytes are not read). The caller must not
// modify it.
func (c *Conn) Header() *Header { return c.header }

// NetConn returns the underlying conn, with its own addresses. Reading from
// it directly skips the bytes read past the header that Read has not
// returned yet.
func (c *Conn) NetConn() net.Conn { return c.conn }

// RemoteAddr returns the header's Source, as a *net.TCPAddr, if the conn has
// a header with Command Proxy and a known Source; otherwise the underlying
// conn's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// LocalAddr returns the header's Destination, as a *net.TCPAddr, when
// RemoteAddr returns its Source; otherwise the underlying conn's local
// address.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// Read reads the bytes read past the header, then the underlying conn. A
// Read that returns bytes of the former returns no bytes of the latter, so
// it never blocks.
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

// WriteTo writes the bytes read past the header to w, then copies the
// underlying conn to w with io.Copy, until EOF or an error. io.Copy calls
// it, so copying a Conn to a *net.TCPConn keeps the kernel's zero-copy
// paths (splice on Linux) after the first bytes.
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
// Conn over a *net.TCPConn keeps the kernel's zero-copy paths.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.conn, r) }

// CloseWrite shuts down the writing side of the underlying conn, as
// (*net.TCPConn).CloseWrite does, so the peer reads EOF while this side can
// still read. It returns an error wrapping errors.ErrUnsupported if the
// underlying conn has no CloseWrite method.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("proxyproto: CloseWrite on a %T: %w", c.conn, errors.ErrUnsupported)
}

// Write writes to the underlying conn.
func (c *Conn) Write(p []byte) (int, error) { return c.conn.Write(p) }

// Close closes the underlying conn. Bytes read past the header and not yet
// returned are dropped.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.prefix = nil
	c.mu.Unlock()
	return c.conn.Close()
}

// SetDeadline sets the underlying conn's deadlines.
func (c *Conn) SetDeadline(t time.Time) error { return c.conn.SetDeadline(t) }

// SetReadDeadline sets the underlying conn's read deadline. Bytes read past
// the header are returned whatever the deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.conn.SetReadDeadline(t) }

// SetWriteDeadline sets the underlying conn's write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.conn.SetWriteDeadline(t) }
