package wire

import (
	"errors"
	"io"
	"net"
	"sync"
)

// A framer reads its transport through a buffer of readBufferSize that it
// holds only while the buffer has bytes left to give: a session waiting for
// its peer, as nearly all of them do nearly all the time, holds none. The
// buffers come from a sync.Pool, one for each read that brings bytes.
//
// How it waits depends on the transport:
//
//   - A socket (*net.TCPConn, *net.UnixConn) is read inside its
//     syscall.RawConn: the buffer is taken from the pool once the socket
//     is readable, just before the read syscall, and given back when the
//     syscall finds nothing to read (EAGAIN). It costs no syscall more
//     than a read through the conn (readbuf_unix.go).
//   - Any other conn (TLS, net.Pipe, a conn wrapped by the app) blocks in
//     its own Read, with the buffer it was given. After a read that came
//     back short (the peer paused: the session is likely to wait next),
//     the framer reads into a small array of its own (smallReadSize,
//     enough for the frames of a session at rest: pings, window updates);
//     after a full one, into a pooled buffer. So a session holds a pooled
//     buffer while it waits only after a read that filled it exactly.
//
// The conn is used as it is given, never unwrapped: a wrapper's Read may
// do more than read (count, or give back bytes it peeked).
const smallReadSize = 128

var readBuffers = sync.Pool{New: func() any {
	b := make([]byte, readBufferSize)
	return &b
}}

// maxEmptyReads bounds the reads in a row that return no bytes and no
// error before a read fails with io.ErrNoProgress, as bufio does.
const maxEmptyReads = 100

// connReader is a framer's buffered reader of its transport.
type connReader struct {
	rd   io.Reader
	conn net.Conn   // rd when it is a net.Conn: for the addresses of raw read errors
	raw  rawReading // set when rd is a socket read through its RawConn

	pooled *[]byte // the pooled buffer holding buf, or nil
	buf    []byte  // bytes read and not given yet are buf[r:w]
	r, w   int
	err    error // the error of the last read, given once the buffer is drained

	small []byte // the reads after a short one, when raw is not set
	short bool   // the last read into a buffer returned less than it asked for
}

func newConnReader(rd io.Reader) *connReader {
	c := &connReader{rd: rd, short: true}
	c.conn, _ = rd.(net.Conn)
	if !c.initRaw() {
		c.small = make([]byte, smallReadSize)
	}
	return c
}

// Read reads as bufio.Reader does: from the buffer while it has bytes,
// straight into p when the buffer is empty and p is at least a buffer
// long, and otherwise with one read into the buffer.
func (c *connReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		if c.r < c.w {
			return 0, nil
		}
		return 0, c.readErr()
	}
	if c.r == c.w {
		if c.err != nil {
			return 0, c.readErr()
		}
		if len(p) >= readBufferSize {
			n, err := c.rd.Read(p)
			if n < 0 {
				panic(errNegativeRead)
			}
			return n, err
		}
		c.fill()
		if c.r == c.w {
			return 0, c.readErr()
		}
	}
	n := copy(p, c.buf[c.r:c.w])
	c.r += n
	if c.r == c.w {
		c.release()
	}
	return n, nil
}

var errNegativeRead = errors.New("wire: reader returned negative count from Read")

func (c *connReader) readErr() error {
	err := c.err
	c.err = nil
	return err
}

// release gives the drained buffer back to the pool.
func (c *connReader) release() {
	c.r, c.w = 0, 0
	c.buf = nil
	if c.pooled != nil {
		readBuffers.Put(c.pooled)
		c.pooled = nil
	}
}

// fill reads once into an empty buffer; it leaves the buffer empty with
// c.err set when the read brought no bytes.
func (c *connReader) fill() {
	if c.raw.ok() {
		c.rawFill()
		return
	}
	buf := c.small
	if !c.short {
		c.pooled = readBuffers.Get().(*[]byte)
		buf = *c.pooled
	}
	for range maxEmptyReads {
		n, err := c.rd.Read(buf)
		if n < 0 {
			panic(errNegativeRead)
		}
		if n > 0 {
			c.buf, c.w = buf, n
			c.short = n < len(buf)
		}
		if err != nil {
			c.err = err
		}
		if n > 0 || err != nil {
			break
		}
	}
	if c.w == 0 {
		if c.err == nil {
			c.err = io.ErrNoProgress
		}
		c.release()
	}
}
