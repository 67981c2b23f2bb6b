package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Listener is a public endpoint on an edge. Its conns are the public
// connections that reached the endpoint, carried over the session. It stays
// open while the client reconnects.
type Listener struct {
	c          *Client
	ownsClient bool

	mu       sync.Mutex
	tunnelID string        // the endpoint in the current session
	url      string        // the public URL
	bind     wire.Bind     // what to ask for when binding again, with the endpoint ticket
	boundOn  *wire.Session // the session the endpoint is bound on; nil: none yet
	err      error         // why Accept fails, once done is closed

	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	shutOnce  sync.Once
}

var _ net.Listener = (*Listener)(nil)

// URL returns the endpoint's public URL: "http://abc.example.test:8080",
// "https://abc.example.test:8443",
// "tls://app.example.test:8443" or "tcp://127.0.0.1:20001".
func (l *Listener) URL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url
}

// AppProtocol returns what the edge speaks to the app on the endpoint's
// conns: "http1" or "h2c" for http and https endpoints, "" for others.
func (l *Listener) AppProtocol() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.bind.Proto != wire.ProtoHTTP && l.bind.Proto != wire.ProtoHTTPS:
		return ""
	case l.bind.Options[wire.OptAppProtocol] == wire.AppProtocolH2C:
		return wire.AppProtocolH2C
	}
	return wire.AppProtocolHTTP1
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

// setBound records a granted endpoint on mux, and the request that gets
// the same one back on another session: the granted name, or port, and the
// endpoint ticket that proves it was ours.
func (l *Listener) setBound(mux *wire.Session, b wire.Bind, resp *wire.BindResp) {
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
	b.Ticket = resp.Ticket
	l.mu.Lock()
	l.tunnelID, l.url, l.bind, l.boundOn = resp.TunnelID, resp.URL, b, mux
	l.mu.Unlock()
}

// setTicket keeps a renewed endpoint ticket.
func (l *Listener) setTicket(t string) {
	l.mu.Lock()
	l.bind.Ticket = t
	l.mu.Unlock()
}

func (l *Listener) rebindRequest() wire.Bind {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bind
}

// bound returns the tunnel ID of the endpoint when it is bound on mux.
func (l *Listener) bound(mux *wire.Session) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tunnelID, l.boundOn == mux && mux != nil
}

// deliver hands c to Accept, or refuses it once the listener is closed, or
// closes it once its session is dead.
func (l *Listener) deliver(c *Conn, dead <-chan struct{}) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.refuse(wire.ReplyNoEndpoint, "the endpoint's listener is closed")
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
//
// The edge learns that the connection reached the app with the conn's
// first Write, CloseWrite or Close, in the same frame; Reject tells it
// instead that the app could not take it (the edge then answers an HTTP
// client 502 app_unreachable).
type Conn struct {
	st     *wire.Stream
	header wire.ProxyHeader

	replied atomic.Bool // the reply went out
	mu      sync.Mutex  // serialises the reply with the first write

	obs       Observer // nil: nothing counted
	in, out   atomic.Int64
	closeOnce sync.Once
}

var _ net.Conn = (*Conn)(nil)

func newConn(st *wire.Stream, h wire.ProxyHeader, obs Observer) *Conn {
	if obs != nil {
		obs.Conn(h.Proto)
	}
	return &Conn{st: st, header: h, obs: obs}
}

// reply sends r once, before any other byte, followed by p in the same
// write. It reports whether this call sent it, and the bytes of p written.
func (c *Conn) reply(r wire.Reply, p []byte) (sent bool, n int, err error) {
	if c.replied.Load() {
		return false, 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replied.Load() {
		return false, 0, nil
	}
	c.replied.Store(true)
	buf := wire.AppendReply(make([]byte, 0, 3+len(r.Message)+len(p)), r)
	head := len(buf)
	m, err := c.st.Write(append(buf, p...))
	return true, max(0, m-head), err
}

// accept sends the reply that says the app took the connection, if no
// reply went out yet.
func (c *Conn) accept() error {
	_, _, err := c.reply(wire.Reply{Status: wire.ReplyOK}, nil)
	return err
}

// refuse tells the edge that the connection did not reach an app, and
// closes it.
func (c *Conn) refuse(status uint8, why string) error {
	sent, _, err := c.reply(wire.Reply{Status: status, Message: why}, nil)
	c.st.Close()
	c.counted()
	if !sent {
		return errors.New("agent: connection accepted already")
	}
	return err
}

// Reject tells the edge that the app could not take this connection, with
// why (a dial error, say), and closes it. It fails when the connection was
// written to already.
func (c *Conn) Reject(why error) error {
	msg := "rejected"
	if why != nil {
		msg = why.Error()
	}
	return c.refuse(wire.ReplyAppUnreachable, msg)
}

// Read reads the client's bytes.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.st.Read(b)
	if c.obs != nil {
		c.in.Add(int64(n))
	}
	return n, err
}

// Write writes to the client.
func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.write(b)
	if c.obs != nil {
		c.out.Add(int64(n))
	}
	return n, err
}

func (c *Conn) write(b []byte) (int, error) {
	if len(b) > 0 {
		if sent, n, err := c.reply(wire.Reply{Status: wire.ReplyOK}, b); sent {
			return n, err
		}
	}
	return c.st.Write(b)
}

// CloseWrite closes the write half: the client reads EOF.
func (c *Conn) CloseWrite() error {
	if err := c.accept(); err != nil {
		return err
	}
	// A deadline in the past (crypto/tls sets one before it closes) would
	// lose the stream's FIN: the edge would hold the connection until its
	// idle timeout.
	c.st.SetWriteDeadline(time.Time{})
	return c.st.CloseWrite()
}

// Close closes the connection.
func (c *Conn) Close() error {
	c.accept()
	c.st.SetWriteDeadline(time.Time{}) // as in CloseWrite
	err := c.st.Close()
	c.counted()
	return err
}

// AfterReset arranges for f to run, in a goroutine of its own, when the
// edge cuts the connection short (its client left, or the edge gave up on
// the exchange) or the session ends: the moment to stop working for the
// client, which a goroutine blocked elsewhere (writing to an app that reads
// nothing) would not otherwise see. f does not run once the connection was
// closed here. stop unregisters f and reports whether it stopped f from
// running, as context.AfterFunc's stop does.
func (c *Conn) AfterReset(f func()) (stop func() bool) { return c.st.AfterReset(f) }

// Reset ends the connection at once, both ways, telling the edge (and so
// its client) that it was cut short rather than ended.
func (c *Conn) Reset() {
	c.st.Reset()
	c.counted()
}

// counted tells the Observer the connection's bytes, once.
func (c *Conn) counted() {
	if c.obs != nil {
		c.closeOnce.Do(func() { c.obs.Bytes(c.header.Proto, c.in.Load(), c.out.Load()) })
	}
}

// LocalAddr returns the session's local address.
func (c *Conn) LocalAddr() net.Addr { return c.st.LocalAddr() }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error { return c.st.SetDeadline(t) }

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.st.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.st.SetWriteDeadline(t) }

// RemoteAddr returns the public client's address (a *net.TCPAddr), or the
// session's remote address when the edge did not know it.
func (c *Conn) RemoteAddr() net.Addr {
	if c.header.Client.IsValid() {
		return net.TCPAddrFromAddrPort(c.header.Client)
	}
	return c.st.RemoteAddr()
}

// Host returns the HTTP Host or TLS server name the client asked for, when
// the edge knew it.
func (c *Conn) Host() string { return c.header.Host }

// Proto returns the endpoint's protocol: "http", "https", "tls" or "tcp".
func (c *Conn) Proto() string { return c.header.Proto }

// addrPortOf returns a TCP address as a netip.AddrPort; the zero value when
// it is not one.
func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}
