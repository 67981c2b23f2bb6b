package proxyproto

import (
	"net"

	"github.com/tunnelkit/tunnelkit/sni"
)

// A Conn is a conn returned by Listener.Accept: its addresses are those of
// its PROXY header, if it has one that carries them, and its Read returns the
// bytes that follow the header.
//
// It is an sni.Conn over the underlying conn whose first bytes are those the
// Listener read past the header: they are returned without touching the
// underlying conn (so a read deadline does not apply to them), and every
// other method passes through, keeping CloseWrite and the kernel's
// zero-copy paths of io.Copy. Conn is safe for concurrent use, as net.Conn
// requires.
type Conn struct {
	*sni.Conn
	header        *Header
	local, remote net.Addr
}

// newConn returns a Conn over c with header h (nil for none) whose first
// bytes are prefix, which it takes ownership of.
func newConn(c net.Conn, h *Header, prefix []byte) *Conn {
	pc := &Conn{Conn: sni.NewConn(c, prefix), header: h, local: c.LocalAddr(), remote: c.RemoteAddr()}
	if h != nil && h.Command == Proxy && h.Source.IsValid() {
		pc.remote = net.TCPAddrFromAddrPort(h.Source)
		pc.local = net.TCPAddrFromAddrPort(h.Destination)
	}
	return pc
}

// Header returns the conn's PROXY header, or nil if it had none (or came
// from an untrusted peer, whose bytes are not read). The caller must not
// modify it.
func (c *Conn) Header() *Header { return c.header }

// RemoteAddr returns the header's Source, as a *net.TCPAddr, if the conn has
// a header with Command Proxy and a known Source; otherwise the underlying
// conn's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// LocalAddr returns the header's Destination, as a *net.TCPAddr, when
// RemoteAddr returns its Source; otherwise the underlying conn's local
// address.
func (c *Conn) LocalAddr() net.Addr { return c.local }
