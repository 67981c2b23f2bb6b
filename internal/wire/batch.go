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
// the conn beneath the TLS conn it writes to); every other write through the TLS conn (its handshake, a
// key update, the close_notify alert) goes straight to the conn, unless it
// comes while a batch is open, and then it joins the batch, in its order.
// Records reach the conn in the order the TLS conn made them: a write
// outside a batch happens within the TLS conn's own write lock, and a
// batch is written out holding the lock that its joiners wait for.

// BatchWrites returns c, for a TLS conn made over it (tls.Client or
// tls.Server) to carry a Session: the Session's framer then writes the
// records of each frame in one Write of c. Any other use of the result is
// the same as a use of c.
func BatchWrites(c net.Conn) net.Conn { return &batchConn{Conn: c} }

// batchConn is the conn BatchWrites returns.
type batchConn struct {
	net.Conn
	mu  sync.Mutex
	buf *[]byte // the open batch, from batchBuffers; nil: none
}

var batchBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, 4*(tlsRecord+tlsOverhead))
	return &b
}}

// tlsOverhead bounds what a TLS record adds to its plaintext (header,
// content type, AEAD tag).
const tlsOverhead = 5 + 1 + 16 + 256

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.buf != nil {
		*c.buf = append(*c.buf, p...)
		c.mu.Unlock()
		return len(p), nil
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// open opens a batch.
func (c *batchConn) open() {
	c.mu.Lock()
	c.buf = batchBuffers.Get().(*[]byte)
	c.mu.Unlock()
}

// flush writes the open batch and closes it.
func (c *batchConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	bp := c.buf
	c.buf = nil
	var err error
	if len(*bp) > 0 {
		// TLS over TLS (an agent's link through an https proxy): the
		// batch goes in one Write of the TLS conn beneath, whose records
		// go together in their turn.
		inner := batchOf(c.Conn)
		if inner != nil {
			inner.open()
		}
		_, err = c.Conn.Write(*bp)
		if inner != nil {
			if ierr := inner.flush(); err == nil {
				err = ierr
			}
		}
	}
	*bp = (*bp)[:0]
	batchBuffers.Put(bp)
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
