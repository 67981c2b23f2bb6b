package limits

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Per-source bounds on the public listeners: the connections one client
// source (an IPv4 address or an IPv6 /64, see Source) holds on a
// listener (an edge's Limits.ConnsPerSource), and the TLS handshakes it
// has under way (Limits.HandshakesPerSource). The source is the real
// client's: an edge wraps its listeners outside the PROXY protocol's.

// Count counts what each client source holds, against a bound: the
// connections of a listener (Limits.ConnsPerSource), which are refused
// past it, and the TLS handshakes under way (Limits.HandshakesPerSource),
// which wait for a slot past it. A handshake waits with its ClientHello
// unread, rather than being closed: a client that opens many connections
// at once (Go's http.Transport dials one per request until its first
// HTTP/2 connection is up) has them all served in turn, as a plain server
// serves them, while the source never has more than the bound of
// handshakes taking the CPU. The connections waiting are bounded by
// Limits.ConnsPerSource, and each waits no longer than its handshake
// would be allowed.
// Its zero value bounds nothing.
type Count struct {
	Max  int             // 0: no bound; set with SetMax once in use
	Stop <-chan struct{} // closed when the server stops: waiters give up

	mu sync.Mutex
	by map[netip.Prefix]*slots // sources holding or waiting for one
}

// slots is what one source holds, and its waiters.
type slots struct {
	n       int           // held
	waiters int           // waiting for one
	wake    chan struct{} // a token when one may be free; made for the first waiter
}

// signal wakes one waiter, if none is awake already.
func (sl *slots) signal() {
	select {
	case sl.wake <- struct{}{}:
	default:
	}
}

// Acquire counts one more for src, waiting while src holds max until
// deadline (a zero deadline: no wait) or until stop is closed; it
// reports whether it counted one. A conn whose address is not an IP
// address (a pipe, a Unix socket) is not counted.
func (c *Count) Acquire(src netip.Prefix, deadline time.Time) bool {
	if !src.IsValid() {
		return true
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[netip.Prefix]*slots{}
	}
	sl := c.by[src]
	if sl == nil {
		sl = &slots{}
		c.by[src] = sl
	}
	for c.Max > 0 && sl.n >= c.Max {
		if deadline.IsZero() {
			return false // sl holds max: it is kept
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		if sl.wake == nil {
			sl.wake = make(chan struct{}, 1)
		}
		sl.waiters++
		c.mu.Unlock()
		var gave bool
		select {
		case <-sl.wake:
		case <-timer.C:
			gave = true
		case <-c.Stop:
			gave = true
		}
		c.mu.Lock()
		sl.waiters--
		if gave {
			if sl.n == 0 && sl.waiters == 0 {
				delete(c.by, src)
			} else if sl.n < c.Max && sl.waiters > 0 {
				sl.signal() // the token this waiter may have missed
			}
			return false
		}
	}
	sl.n++
	if sl.n < c.Max && sl.waiters > 0 {
		sl.signal() // two freed, one token: pass it on
	}
	return true
}

// SetMax changes Max: the next Acquire holds to it, and those waiting
// for a slot that it gives are woken.
func (c *Count) SetMax(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Max = n
	for _, sl := range c.by {
		if sl.waiters > 0 {
			sl.signal()
		}
	}
}

// Release counts one less for src, which Acquire counted.
func (c *Count) Release(src netip.Prefix) {
	if !src.IsValid() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sl := c.by[src]
	if sl == nil {
		return
	}
	sl.n--
	switch {
	case sl.waiters > 0:
		sl.signal()
	case sl.n == 0:
		delete(c.by, src)
	}
}

// Listener closes, as they are accepted, the connections of a source
// holding Conns.Max connections of the listener.
type Listener struct {
	net.Listener
	Conns Count
	// Refused, if set, is called with each connection closed, before it
	// is closed: whoever sees the close sees what Refused counted.
	Refused func(net.Conn)
}

// Accept returns the next connection whose source holds fewer than its
// bound; the others are closed.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := SourceOf(c.RemoteAddr())
		if l.Conns.Acquire(src, time.Time{}) {
			return &sourceConn{Conn: c, release: func() { l.Conns.Release(src) }}, nil
		}
		if l.Refused != nil {
			l.Refused(c)
		}
		c.Close()
	}
}

// sourceConn gives its place back to its source when it is closed.
type sourceConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *sourceConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection, when the conn under it can.
func (c *sourceConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errNoHalfClose
}

var errNoHalfClose = errors.New("limits: the connection cannot be half-closed")
