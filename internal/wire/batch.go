package wire

import (
	"crypto/tls"
	"net"
	"sync"
)

// Writing a TLS link's records together. crypto/tls writes each record of
// a Write to its conn apart: a frame of MaxFrameData bytes is four records
// and four syscalls, where the same frame on a plain link is one. A conn
// made with BatchWrites, beneath a TLS conn that a Session speaks on,
// gathers the records of each frame the framer writes and writes them in
// one Write.
//
// Only the framer opens a batch, and only for the length of one Write of
// the TLS conn (and, for TLS over TLS, a batch's flush opens the batch of
// the conn beneath the TLS conn it writes to). Every other write through
// the TLS conn (its handshake, a key update, the close_notify alert) goes
// straight to the conn, unless it comes while a batch is open or being
// written: then it joins the batch, or is written right after it, and
// returns at once. Records reach the conn in the order the TLS conn made
// them: a write outside a batch happens within the TLS conn's own write
// lock, which the framer's Write waits for before its records join the
// batch.

// BatchWrites returns c, for a TLS conn made over it (tls.Client or
// tls.Server) to carry a Session: the Session's framer then writes the
// records of each frame in one Write of c. Any other use of the result is
// the same as a use of c.
func BatchWrites(c net.Conn) net.Conn { return &batchConn{Conn: c, inner: batchOf(c)} }

// batchConn is the conn BatchWrites returns.
type batchConn struct {
	net.Conn
	inner    *batchConn // beneath Conn when it is a TLS conn over BatchWrites (TLS over TLS); nil: none
	mu       sync.Mutex
	buf      *[]byte // the open batch, from batchBuffers; nil: none
	flushing bool    // a batch is being written
	tail     []byte  // writes made while a batch was written, written after it
}

var batchBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, 4*(tlsRecord+tlsOverhead))
	return &b
}}

// tlsOverhead bounds what a TLS record adds to its plaintext (header,
// content type, AEAD tag).
const tlsOverhead = 5 + 1 + 16 + 256

// Write joins the open batch, or the tail of the batch being written, or
// writes p to the conn. A write never waits for a batch being written:
// the TLS conn's Close sends its close_notify alert through here, and must
// not wait behind a stalled socket (without batches, crypto/tls's Close
// does not wait for a Write in flight: it closes the conn, which ends it).
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	switch {
	case c.buf != nil:
		*c.buf = append(*c.buf, p...)
	case c.flushing:
		c.tail = append(c.tail, p...)
	default:
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	c.mu.Unlock()
	return len(p), nil
}

// open opens a batch.
func (c *batchConn) open() {
	c.mu.Lock()
	c.buf = batchBuffers.Get().(*[]byte)
	c.mu.Unlock()
}

// flush writes the open batch, and then what joined it while it was
// written; once one of those writes fails, what joined after is dropped.
func (c *batchConn) flush() error {
	c.mu.Lock()
	bp := c.buf
	c.buf = nil
	c.flushing = true
	c.mu.Unlock()
	err := c.write(*bp)
	*bp = (*bp)[:0]
	batchBuffers.Put(bp)
	for {
		c.mu.Lock()
		tail := c.tail
		c.tail = nil
		if len(tail) == 0 || err != nil {
			c.flushing = false
			c.mu.Unlock()
			return err
		}
		c.mu.Unlock()
		err = c.write(tail)
	}
}

// write writes b to the conn in one Write. Over TLS over TLS (an agent's
// link through an https proxy), that is one Write of the TLS conn
// beneath, whose records go together in their turn.
func (c *batchConn) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if c.inner != nil {
		c.inner.open()
	}
	_, err := c.Conn.Write(b)
	if c.inner != nil {
		if ierr := c.inner.flush(); err == nil {
			err = ierr
		}
	}
	return err
}

// batchOf returns the batchConn beneath w, a TLS conn made over one; nil
// for any other writer.
func batchOf(w any) *batchConn {
	tc, ok := w.(*tls.Conn)
	if !ok {
		return nil
	}
	b, _ := tc.NetConn().(*batchConn)
	return b
}
