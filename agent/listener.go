package agent

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"sync"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Listener is a public endpoint on an edge. Its conns are the public
// connections that reached the endpoint, carried over the session. It stays
// open while the client reconnects.
type Listener struct {
	c          *Client
	ownsClient bool

	mu       sync.Mutex
	tunnelID string    // the endpoint in the current session
	url      string    // the public URL
	bind     wire.Bind // what to ask for when binding again
	err      error     // why Accept fails, once done is closed

	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	shutOnce  sync.Once
}

var _ net.Listener = (*Listener)(nil)

// URL returns the endpoint's public URL: "http://abc.example.test:8080",
// "tls://app.example.test:8443" or "tcp://127.0.0.1:20001".
func (l *Listener) URL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url
}

// Addr returns the endpoint's public URL as a net.Addr of network "tunnel".
func (l *Listener) Addr() net.Addr { return Addr{URL: l.URL()} }

// Accept waits for the next public connection. Its RemoteAddr is the
// client's address. After Close, after the client is closed, or when the
// endpoint was lost for good on a reconnection, Accept returns an error
// wrapping net.ErrClosed (and, for a lost endpoint, its cause, such as
// ErrNameTaken).
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		err := l.err
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tunnel", Addr: l.Addr(), Err: err}
	}
}

// Close releases the endpoint on the edge and makes Accept return. For a
// listener from the package-level Listen, it also closes the session. It is
// safe to call more than once.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.shut()
		l.c.unbind(l)
		if l.ownsClient {
			l.c.Close()
		}
	})
	return nil
}

// shut makes Accept return net.ErrClosed.
func (l *Listener) shut() { l.fail(nil) }

// fail makes Accept return an error wrapping net.ErrClosed and cause.
func (l *Listener) fail(cause error) {
	l.shutOnce.Do(func() {
		l.mu.Lock()
		l.err = net.ErrClosed
		if cause != nil {
			l.err = fmt.Errorf("%w: %w", net.ErrClosed, cause)
		}
		l.mu.Unlock()
		close(l.done)
	})
}

// setBound records a granted endpoint, and the request that gets the same
// one back on another session: the granted name, or port.
func (l *Listener) setBound(b wire.Bind, resp *wire.BindResp) {
	if u, err := url.Parse(resp.URL); err == nil {
		switch b.Proto {
		case wire.ProtoTCP:
			if p, err := strconv.Atoi(u.Port()); err == nil {
				b.Port = p
			}
		default:
			b.Name = u.Hostname()
		}
	}
	l.mu.Lock()
	l.tunnelID, l.url, l.bind = resp.TunnelID, resp.URL, b
	l.mu.Unlock()
}

func (l *Listener) rebindRequest() wire.Bind {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bind
}

// deliver hands c to Accept, or closes it once the listener is closed or
// its session dead.
func (l *Listener) deliver(c net.Conn, dead <-chan struct{}) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	case <-dead:
		c.Close()
	}
}

// Addr is the address of a Listener: its public URL.
type Addr struct{ URL string }

// Network returns "tunnel".
func (Addr) Network() string { return "tunnel" }

func (a Addr) String() string { return a.URL }

// Conn is a public connection carried over the session. RemoteAddr is the
// client's address as the edge saw it; CloseWrite closes the write half.
type Conn struct {
	muxado.Stream
	header wire.ProxyHeader
}

var _ net.Conn = (*Conn)(nil)

func newConn(st muxado.Stream, h wire.ProxyHeader) *Conn {
	return &Conn{Stream: st, header: h}
}

// RemoteAddr returns the public client's address (a *net.TCPAddr), or the
// session's remote address when the edge did not know it.
func (c *Conn) RemoteAddr() net.Addr {
	if c.header.Client.IsValid() {
		return net.TCPAddrFromAddrPort(c.header.Client)
	}
	return c.Stream.RemoteAddr()
}

// Host returns the HTTP Host or TLS server name the client asked for, when
// the edge knew it.
func (c *Conn) Host() string { return c.header.Host }

// Proto returns the endpoint's protocol: "http", "tls" or "tcp".
func (c *Conn) Proto() string { return c.header.Proto }

// addrPortOf returns a TCP address as a netip.AddrPort; the zero value when
// it is not one.
func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}
