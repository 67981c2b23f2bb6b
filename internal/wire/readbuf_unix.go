//go:build unix

package wire

import (
	"io"
	"net"
	"os"
	"syscall"
)

// rawReading is how a connReader reads a socket inside its RawConn.
type rawReading struct {
	rc syscall.RawConn
	fn func(fd uintptr) bool // the connReader's readFD, bound once: binding it at each read would allocate
	// err is what readFD found: a read error, io.EOF, or nil.
	err error
}

func (r *rawReading) ok() bool { return r.rc != nil }

// initRaw sets c up to read its socket inside the socket's RawConn, when
// c reads a TCP or Unix stream socket as such (a conn of type
// *net.TCPConn or *net.UnixConn, not a wrapper of one).
func (c *connReader) initRaw() bool {
	var sc syscall.Conn
	switch conn := c.rd.(type) {
	case *net.TCPConn:
		sc = conn
	case *net.UnixConn:
		if conn.LocalAddr().Network() != "unix" {
			return false // a datagram or seqpacket socket: its reads keep message bounds
		}
		sc = conn
	default:
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	c.raw.rc = rc
	c.raw.fn = c.readFD
	return true
}

// rawFill reads once into a pooled buffer, waiting for the socket to be
// readable (and for its read deadline) as the conn's own Read does.
func (c *connReader) rawFill() {
	c.raw.err = nil
	err := c.raw.rc.Read(c.raw.fn)
	if err != nil {
		// A closed conn or a deadline: give the error as the conn's Read
		// would, an *net.OpError of op "read".
		if oe, ok := err.(*net.OpError); ok {
			e := *oe
			e.Op = "read"
			err = &e
		}
	} else if err = c.raw.err; err != nil && err != io.EOF {
		err = &net.OpError{Op: "read", Net: c.conn.LocalAddr().Network(), Source: c.conn.LocalAddr(), Addr: c.conn.RemoteAddr(), Err: err}
	}
	c.err = err
}

// readFD reads the socket fd into a buffer from the pool, which it keeps
// when the read brought bytes and gives back otherwise. It returns false
// when the socket has nothing to read yet: RawConn.Read then waits until
// it is readable and calls it again.
func (c *connReader) readFD(fd uintptr) bool {
	bp := readBuffers.Get().(*[]byte)
	for {
		n, err := syscall.Read(int(fd), *bp)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			readBuffers.Put(bp)
			return false
		}
		if n > 0 {
			c.pooled, c.buf, c.r, c.w = bp, *bp, 0, n
			return true
		}
		readBuffers.Put(bp)
		if err != nil {
			c.raw.err = os.NewSyscallError("read", err)
		} else {
			c.raw.err = io.EOF // a stream socket's zero-byte read: the peer closed its end
		}
		return true
	}
}
