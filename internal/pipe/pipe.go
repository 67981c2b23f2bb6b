// Package pipe joins two connections, copying both ways and keeping
// half-closes: when one side stops sending, the other side's write half is
// closed, and bytes still flowing the other way keep flowing.
package pipe

import (
	"errors"
	"io"
	"net"
	"sync"
)

// closeWriter is a conn whose write half can be closed alone
// (*net.TCPConn, *tls.Conn, muxado streams, sni.Conn).
type closeWriter interface {
	CloseWrite() error
}

// Join copies from a to b and from b to a until both directions end, then
// closes both conns. When a direction ends cleanly (EOF), the receiving
// side's write half is closed with CloseWrite, or the conn closed when it has
// no CloseWrite. When a direction fails, both conns are closed so the other
// direction ends too. Join returns the bytes copied each way and the first
// error other than a clean end.
func Join(a, b net.Conn) (aToB, bToA int64, err error) {
	var wg sync.WaitGroup
	var errB error
	wg.Go(func() { bToA, errB = copyHalf(a, b) })
	aToB, err = copyHalf(b, a)
	wg.Wait()
	a.Close()
	b.Close()
	if err == nil {
		err = errB
	}
	return aToB, bToA, err
}

// copyHalf copies src to dst, then closes dst's write half. It is a named
// function so that goroutine dumps show what a proxy is doing.
func copyHalf(dst, src net.Conn) (int64, error) {
	n, err := io.Copy(dst, src)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		// Unblock the other direction: its reader would otherwise wait on
		// a peer that may never send again.
		dst.Close()
		src.Close()
		return n, err
	}
	if cw, ok := dst.(closeWriter); ok {
		if cw.CloseWrite() == nil {
			return n, nil
		}
	}
	dst.Close()
	return n, nil
}
