package edge

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Per-source bounds on the public listeners: the connections one client
// source (an IPv4 address or an IPv6 /64, see sourceOf) holds on a
// listener (Limits.ConnsPerSource), and the TLS handshakes it has under
// way (Limits.HandshakesPerSource, see terminate). The source is the real
// client's: the listeners are wrapped outside the PROXY protocol's.

// sourceCount counts what each client source holds, against a bound: the
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
type sourceCount struct {
	max  int             // 0: no bound
	stop <-chan struct{} // closed when the server stops: waiters give up

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

// acquire counts one more for src, waiting while src holds max until
// deadline (a zero deadline: no wait) or until stop is closed; it
// reports whether it counted one. A conn whose address is not an IP
// address (a pipe, a Unix socket) is not counted.
func (c *sourceCount) acquire(src netip.Prefix, deadline time.Time) bool {
	if c.max <= 0 || !src.IsValid() {
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
	for sl.n >= c.max {
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
		case <-c.stop:
			gave = true
		}
		c.mu.Lock()
		sl.waiters--
		if gave {
			if sl.n == 0 && sl.waiters == 0 {
				delete(c.by, src)
			} else if sl.n < c.max && sl.waiters > 0 {
				sl.signal() // the token this waiter may have missed
			}
			return false
		}
	}
	sl.n++
	if sl.n < c.max && sl.waiters > 0 {
		sl.signal() // two freed, one token: pass it on
	}
	return true
}

// release counts one less for src, which acquire counted.
func (c *sourceCount) release(src netip.Prefix) {
	if c.max <= 0 || !src.IsValid() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sl := c.by[src]
	sl.n--
	switch {
	case sl.waiters > 0:
		sl.signal()
	case sl.n == 0:
		delete(c.by, src)
	}
}

// sourceListener closes, as they are accepted, the connections of a
// source holding Limits.ConnsPerSource connections of the listener.
type sourceListener struct {
	net.Listener
	srv   *Server
	conns sourceCount
}

// perSource wraps ln, a public listener, to bound the connections each
// client source holds on it, unless that bound is off.
func (s *Server) perSource(ln net.Listener) net.Listener {
	if s.cfg.connsPerSource <= 0 {
		return ln
	}
	return &sourceListener{Listener: ln, srv: s, conns: sourceCount{max: s.cfg.connsPerSource}}
}

// Accept returns the next connection whose source holds fewer than its
// bound; the others are closed (and logged at the Debug level only: a
// stranger chooses how many it opens).
func (l *sourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(addrPort(c.RemoteAddr()).Addr())
		if l.conns.acquire(src, time.Time{}) {
			return &sourceConn{Conn: c, release: func() { l.conns.release(src) }}, nil
		}
		// Counted before the close: whoever sees the close sees the count.
		l.srv.obs().Refused(ReasonConnLimit)
		l.srv.log().Debug("public connection refused: its source holds its share of the listener", "client", c.RemoteAddr().String(), "listener", l.Addr().String(), "max", l.conns.max)
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

var errNoHalfClose = errors.New("edge: the connection cannot be half-closed")
