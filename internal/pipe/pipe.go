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
	return join(a, b, func(dst, src net.Conn) (int64, error) { return io.Copy(dst, src) })
}

// resetNotifier is a conn that the peer may cut short while nobody reads
// or writes it (a mux stream): AfterReset runs f then (see
// wire.Stream.AfterReset).
type resetNotifier interface {
	AfterReset(f func()) (stop func() bool)
}

// join runs copyHalf both ways with copy, then closes both conns. A conn
// that its peer cuts short ends both directions at once, even while a
// direction waits on the other conn (writing to a peer that reads
// nothing).
func join(a, b net.Conn, copy func(dst, src net.Conn) (int64, error)) (aToB, bToA int64, err error) {
	for _, c := range []net.Conn{a, b} {
		if rn, ok := unwrap(c).(resetNotifier); ok {
			stop := rn.AfterReset(func() { abort(a); abort(b) })
			defer stop()
		}
	}
	var wg sync.WaitGroup
	var errB error
	wg.Go(func() { bToA, errB = copyHalf(a, b, copy) })
	aToB, err = copyHalf(b, a, copy)
	wg.Wait()
	a.Close()
	b.Close()
	if err == nil {
		err = errB
	}
	return aToB, bToA, err
}

// resetter is a conn that can be cut short rather than closed, telling
// its peer so (a mux stream).
type resetter interface{ Reset() }

// abort ends c at once: a reset when it can tell its peer, else a close.
func abort(c net.Conn) {
	if r, ok := unwrap(c).(resetter); ok {
		r.Reset()
		return
	}
	c.Close()
}

// unwrap returns the conn beneath this package's wrappers (idleConn,
// observed).
func unwrap(c net.Conn) net.Conn {
	for {
		switch w := c.(type) {
		case *idleConn:
			c = w.Conn
		case *observed:
			c = w.Conn
		default:
			return c
		}
	}
}

// copyHalf copies src to dst, then closes dst's write half. It is a named
// function so that goroutine dumps show what a proxy is doing.
func copyHalf(dst, src net.Conn, copy func(dst, src net.Conn) (int64, error)) (int64, error) {
	n, err := copy(dst, src)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		// Unblock the other direction: its reader would otherwise wait on
		// a peer that may never send again. A stream is reset, so that
		// its peer hears that the connection broke rather than ended.
		abort(dst)
		abort(src)
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

// JoinStreams is Join for pairs where a side is a mux stream (or any conn
// without kernel fast paths): it copies through pooled 256 KiB buffers,
// which move a stream's bytes in far fewer, larger frames than io.Copy's
// 32 KiB, and, when idle is positive, closes both conns once no byte moved
// either way for idle. The conns are wrapped to see their traffic, so the
// splice path between two TCP conns is lost: use Join for those.
func JoinStreams(a, b net.Conn, idle time.Duration) (aToB, bToA int64, err error) {
	act := &activity{}
	act.touch()
	if idle > 0 {
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
	}
	return join(&idleConn{a, act}, &idleConn{b, act}, copyBuffered)
}

// Buffers of JoinStreams. A direction waits for data in a small buffer of
// its own; once a read fills it, bytes are flowing, and the direction copies
// through a pooled large buffer until a read comes back short. So an idle
// connection holds kilobytes, not the large buffers, while a bulk transfer
// moves in large frames.
const (
	smallBuffer = 8 << 10
	largeBuffer = 256 << 10
)

var (
	smallBuffers = sync.Pool{New: func() any { b := make([]byte, smallBuffer); return &b }}
	buffers      = sync.Pool{New: func() any { b := make([]byte, largeBuffer); return &b }}
)

// copyBuffered copies src to dst as described above. Its conns are
// idleConns, which have neither ReadFrom nor WriteTo.
func copyBuffered(dst, src net.Conn) (written int64, err error) {
	sb := smallBuffers.Get().(*[]byte)
	defer smallBuffers.Put(sb)
	small := *sb
	for {
		n, rerr := src.Read(small)
		if err := writeAll(dst, small[:n], &written); err != nil {
			return written, err
		}
		if rerr != nil {
			return written, eof(rerr)
		}
		if n < len(small) {
			continue
		}
		// Bytes are flowing: read through the large buffer until the
		// source has less to give than it holds.
		buf := buffers.Get().(*[]byte)
		for {
			n, rerr = src.Read(*buf)
			if err := writeAll(dst, (*buf)[:n], &written); err != nil {
				buffers.Put(buf)
				return written, err
			}
			if rerr != nil {
				buffers.Put(buf)
				return written, eof(rerr)
			}
			if n < len(*buf)/4 {
				break
			}
		}
		buffers.Put(buf)
	}
}

// writeAll writes p to dst, counting what was written.
func writeAll(dst io.Writer, p []byte, written *int64) error {
	if len(p) == 0 {
		return nil
	}
	n, err := dst.Write(p)
	*written += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return err
}

// eof turns the io.EOF that ends a copy into nil, as io.Copy does.
func eof(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
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

// Observe returns c with see called with what each of its Reads returns,
// before it returns it, and end called once, when a Read of c meets EOF:
// what end returns is read before that EOF. Either may be nil. Join and
// JoinStreams see through it: a stream beneath it is still reset, and
// told of its peer's resets.
func Observe(c net.Conn, see func([]byte), end func() []byte) net.Conn {
	return &observed{Conn: c, see: see, end: end}
}

// observed is the conn Observe returns.
type observed struct {
	net.Conn
	see   func([]byte)
	end   func() []byte
	ended bool   // a Read of Conn met EOF
	tail  []byte // what end returned, not read yet
}

func (c *observed) Read(p []byte) (int, error) {
	if !c.ended {
		n, err := c.Conn.Read(p)
		if n > 0 && c.see != nil {
			c.see(p[:n])
		}
		if err != io.EOF || c.end == nil {
			return n, err
		}
		c.ended = true
		c.tail = c.end()
		if n > 0 {
			return n, nil
		}
	}
	if len(c.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.tail)
	c.tail = c.tail[n:]
	if c.see != nil {
		c.see(p[:n])
	}
	return n, nil
}

// CloseWrite closes the write half of the wrapped conn.
func (c *observed) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
