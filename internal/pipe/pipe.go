// Package pipe joins two connections, copying both ways and keeping
// half-closes: when one side stops sending, the other side's write half is
// closed, and bytes still flowing the other way keep flowing.
package pipe

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
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

// JoinIdle is Join that also closes both conns once no byte moved either
// way for idle. A zero or negative idle is Join. The conns are wrapped to
// see their traffic, which costs the splice fast path between two TCP
// conns: use it where one side is a mux stream anyway.
func JoinIdle(a, b net.Conn, idle time.Duration) (aToB, bToA int64, err error) {
	if idle <= 0 {
		return Join(a, b)
	}
	act := &activity{}
	act.touch()
	var timer *time.Timer
	var mu sync.Mutex
	check := func() {
		since := time.Duration(time.Now().UnixNano() - act.last.Load())
		if since >= idle {
			a.Close()
			b.Close()
			return
		}
		mu.Lock()
		timer.Reset(idle - since)
		mu.Unlock()
	}
	mu.Lock()
	timer = time.AfterFunc(idle, check)
	mu.Unlock()
	defer timer.Stop()
	return Join(&idleConn{a, act}, &idleConn{b, act})
}

// activity is the time of the last byte moved on a pair of conns.
type activity struct{ last atomic.Int64 }

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// idleConn records its traffic in an activity.
type idleConn struct {
	net.Conn
	act *activity
}

func (c *idleConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.act.touch()
	}
	return n, err
}

func (c *idleConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.act.touch()
	}
	return n, err
}

// CloseWrite closes the write half of the wrapped conn.
func (c *idleConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
