package edge

import (
	"errors"
	"net"
	"net/netip"
	"sync"
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
