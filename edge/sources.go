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

// sourceCount counts what each client source holds, against a bound.
type sourceCount struct {
	max int // 0: no bound

	mu sync.Mutex
	n  map[netip.Prefix]int // sources holding one or more
}

// acquire counts one more for src, unless src holds max already. A conn
// whose address is not an IP address (a pipe, a Unix socket) is not
// counted.
func (c *sourceCount) acquire(src netip.Prefix) bool {
	if c.max <= 0 || !src.IsValid() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[src] >= c.max {
		return false
	}
	if c.n == nil {
		c.n = map[netip.Prefix]int{}
	}
	c.n[src]++
	return true
}

// release counts one less for src, which acquire counted.
func (c *sourceCount) release(src netip.Prefix) {
	if c.max <= 0 || !src.IsValid() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[src]--; c.n[src] <= 0 {
		delete(c.n, src)
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
		if l.conns.acquire(src) {
			return &sourceConn{Conn: c, release: func() { l.conns.release(src) }}, nil
		}
		c.Close()
		l.srv.obs().Refused(ReasonConnLimit)
		l.srv.log().Debug("public connection refused: its source holds its share of the listener", "client", c.RemoteAddr().String(), "listener", l.Addr().String(), "max", l.conns.max)
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

// handshakeSlots bounds the TLS handshakes under way per client source
// (Limits.HandshakesPerSource). A connection past the bound waits for a
// slot, its ClientHello unread in its socket, rather than being closed:
// a client that opens many connections at once (Go's http.Transport
// dials one per request until its first HTTP/2 connection is up) gets
// them all served in turn, as a plain server serves them, while the
// source never has more than the bound of handshakes taking the CPU. The
// connections waiting are bounded by Limits.ConnsPerSource, and each
// waits no longer than its handshake would be allowed.
type handshakeSlots struct {
	max  int           // 0: no bound
	stop chan struct{} // closed when the server stops: waiters give up

	mu sync.Mutex
	by map[netip.Prefix]*slots // sources holding or waiting for one
}

// slots is one source's handshakes under way, and its waiters.
type slots struct {
	n       int           // under way
	waiters int           // waiting for one
	wake    chan struct{} // a token when one may be free
}

// signal wakes one waiter, if none is awake already.
func (sl *slots) signal() {
	select {
	case sl.wake <- struct{}{}:
	default:
	}
}

// acquire takes a slot for src, waiting for one until deadline or until
// the server stops; it reports whether it got one. A conn whose address
// is not an IP address (a pipe, a Unix socket) is not counted.
func (h *handshakeSlots) acquire(src netip.Prefix, deadline time.Time) bool {
	if h.max <= 0 || !src.IsValid() {
		return true
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by == nil {
		h.by = map[netip.Prefix]*slots{}
	}
	sl := h.by[src]
	if sl == nil {
		sl = &slots{wake: make(chan struct{}, 1)}
		h.by[src] = sl
	}
	for sl.n >= h.max {
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		sl.waiters++
		h.mu.Unlock()
		var gave bool
		select {
		case <-sl.wake:
		case <-timer.C:
			gave = true
		case <-h.stop:
			gave = true
		}
		h.mu.Lock()
		sl.waiters--
		if gave {
			if sl.n == 0 && sl.waiters == 0 {
				delete(h.by, src)
			} else if sl.n < h.max && sl.waiters > 0 {
				sl.signal() // the token this waiter may have missed
			}
			return false
		}
	}
	sl.n++
	if sl.n < h.max && sl.waiters > 0 {
		sl.signal() // two slots freed, one token: pass it on
	}
	return true
}

// release gives back a slot of src that acquire took.
func (h *handshakeSlots) release(src netip.Prefix) {
	if h.max <= 0 || !src.IsValid() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	sl := h.by[src]
	sl.n--
	switch {
	case sl.waiters > 0:
		sl.signal()
	case sl.n == 0:
		delete(h.by, src)
	}
}
