package agent

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"

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
	replaced string        // the tunnel ID that tunnelID took the place of (Update) on boundOn; "" for none
	url      string        // the public URL
	bind     wire.Bind     // what to ask for when binding again, with the endpoint ticket
	boundOn  *wire.Session // the session the endpoint is bound on; nil: none yet
	health   *healthRunner // its health check's; nil: none
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

// VerboseErrors reports whether the endpoint shows the public the detail
// of what went wrong in its error pages (Endpoint.VerboseErrors): a
// forwarder's answers for its app follow it.
func (l *Listener) VerboseErrors() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bind.Options[wire.OptVerboseErrors] == "true"
}

// Ticket returns the endpoint ticket the edge gave with the latest bind
// or renewal of the endpoint, to keep for a later listener's
// Endpoint.Ticket.
func (l *Listener) Ticket() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bind.Ticket
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
	l.tunnelID, l.url, l.bind, l.boundOn, l.replaced = resp.TunnelID, resp.URL, b, mux, ""
	l.mu.Unlock()
	l.rebound()
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

// pooledOn reports whether the endpoint asked for a pool when it was bound
// on mux: its conns tell the edge with their first Read that the app
// took them (an edge of before wire.AdmitVersion reads that reply as it
// would have read it with the first byte).
func (l *Listener) pooledOn(mux *wire.Session) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bind.Pool && l.boundOn == mux
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

// String returns the URL.
func (a Addr) String() string { return a.URL }
