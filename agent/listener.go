package agent

import (
	"net"
	"sync"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Listener is a public endpoint on an edge. Its conns are the public
// connections that reached the endpoint, carried over the session.
type Listener struct {
	c          *Client
	tunnelID   string
	url        string
	ownsClient bool

	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	shutOnce  sync.Once
}

var _ net.Listener = (*Listener)(nil)

// URL returns the endpoint's public URL, "http://abc.example.test:8080".
func (l *Listener) URL() string { return l.url }

// Addr returns the endpoint's public URL as a net.Addr of network "tunnel".
func (l *Listener) Addr() net.Addr { return Addr{URL: l.url} }

// Accept waits for the next public connection. Its RemoteAddr is the
// client's address. After Close, or when the session ends, Accept returns
// an error wrapping net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "tunnel", Addr: l.Addr(), Err: net.ErrClosed}
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

// shut makes Accept return; conns waiting for it are closed.
func (l *Listener) shut() {
	l.shutOnce.Do(func() { close(l.done) })
}

// deliver hands c to Accept, or closes it once the listener is closed.
func (l *Listener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
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
