package agent

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Conn is a public connection carried over the session. RemoteAddr is the
// client's address as the edge saw it; CloseWrite closes the write half.
//
// The edge learns that the connection reached the app with the conn's
// first Write, CloseWrite or Close, in the same frame, and, for an endpoint
// that asked for a pool (Pooled), already with its first Read: an edge
// holds a request's body, or a connection's bytes, until it knows, so that
// it can send them to another member of the pool instead. Reject tells it
// that the app could not take the connection (the edge then tries another
// member of a pool, or answers an HTTP client 502 app_unreachable).
type Conn struct {
	st     *wire.Stream
	header wire.ProxyHeader
	pooled bool // its endpoint asked for a pool: the first Read accepts it

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

// Pooled reports whether the conn's endpoint is one of a pool's members
// whose edge takes the conn's first Read as the app having taken it (see
// Conn): a forwarder whose app cannot be reached should Reject the conn
// before it reads it, and the edge tries another member.
func (c *Conn) Pooled() bool { return c.pooled }

// Read reads the client's bytes.
func (c *Conn) Read(b []byte) (int, error) {
	if c.pooled && !c.replied.Load() {
		if err := c.accept(); err != nil {
			return 0, err
		}
	}
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
