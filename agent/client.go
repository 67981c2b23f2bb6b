package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Client is one session to an edge, carrying any number of listeners. Its
// zero value with Addrs set is ready to use: the session is opened by the
// first Listen, which waits for its edge (see ListenEndpoint). Given
// several edges, it holds a session to one of them at a time (see Addrs).
// When the session ends while listeners are open, the
// client reconnects on its own, with exponential backoff and jitter,
// forever until closed, and binds every listener's endpoint again with the
// same name: the listeners stay open across the gap. The edge's session
// ticket makes the new session take over the old one's endpoints at once,
// even when the edge has not yet noticed that the old one died; endpoint
// tickets get the names back after the edge restarted. A bind the edge
// cannot grant for now is tried again with backoff; only a name lost for
// good (ErrNameTaken, ErrRefused) ends a listener, whose Accept then
// returns that error. An edge that drains (edge.Server.Drain) asks the
// client to move: it opens a session to another edge of Addrs, binds its
// endpoints there, which takes them over at once, and only then leaves
// the old session, which carries what was in flight until its edge ends
// it (a Connected event tells the move; no Disconnected). Opening a
// session to one edge (the dial, TLS, the hello) takes at most 10 s,
// within the context given to Listen. A Client must not be copied, nor
// its fields changed, after first use.
type Client struct {
	// Addrs are the agent addresses of the edges, "host:port" each (an
	// agent port, or an edge's public TLS port, which takes agents over
	// TLS: see TLSConfig), tried in order: one edge, or edges that share their names (a cluster
	// behind DNS), so that an endpoint comes back with the same name on
	// any of them. The client holds a session to one edge at a time. The
	// first goes to the first edge that takes it: when an attempt fails
	// (the dial, TLS, the hello, or no answer within 10 s), the next edge
	// is tried at once. When a session ends, the client reconnects to the
	// edge after the one it was on (that one may be the edge that died),
	// and so on through the list, wrapping around. Each round of
	// attempts, one per edge, starts after the backoff wait (see
	// MinBackoff); within a round, a failed attempt moves on to the next
	// edge at once. A listener's URL is then the one the new edge answered
	// (Listener.URL). An address listed twice is tried once per round;
	// empty ones are left out. Listen fails when none is left. For one
	// edge, the package-level Listen takes its address alone.
	Addrs []string

	// Token is presented to the edge in the hello. Empty: none.
	Token string

	// ResumeTicket is a session ticket that an earlier Client of the same
	// agent got from the edge (its Ticket, kept across a restart of the
	// process, as the example agent's -state file keeps it). The first
	// hello presents it: the edge then closes that client's session if it
	// still holds it, so that this one's binds get its endpoints at once,
	// and gives an agent of an edge without authentication its identity
	// back, and with it the names kept for that identity after its
	// session ended. An edge ignores a ticket it did not sign (another
	// ticket key), and one of another identity than the token's. Empty:
	// none; later hellos present the latest session's ticket either way.
	ResumeTicket string

	// TLSConfig is the configuration for TLS to the edges. An empty
	// ServerName stands for the host of each edge's address, as with
	// tls.Dial; set one only when every edge's certificate carries it. Nil:
	// TLS with the system's roots and each edge's host as the server name,
	// except that a loopback edge ("127.0.0.1:7000", "localhost:7000") is
	// plaintext. Its NextProtos are replaced: the agent offers the agent
	// protocol ("tunnelkit/1") alone by ALPN, which lets an edge take the
	// session on its public TLS port (see edge.Server.NoAgentsOnTLS), and
	// takes an edge that selects it or none (an agent port).
	TLSConfig *tls.Config

	// Plaintext connects without TLS, whatever the edges' addresses are.
	// Use it only for edges behind a TLS-terminating proxy or on a private
	// network.
	Plaintext bool

	// DialContext opens the TCP connection to the edge, or to the proxy
	// when there is one (see Proxy); also those of the probes that tell
	// what answers at an edge's address when it is not an edge's agent
	// port (ErrNotAgentPort, ErrTLSExpected, ErrPlaintextExpected). Nil: a
	// net.Dialer.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// Proxy returns the proxy to reach the edge at edgeAddr ("host:port")
	// through, or nil to dial the edge directly; it is called at each
	// attempt to connect. http:// and https:// proxies open a tunnel with
	// CONNECT, with Basic credentials from the URL's user and password (an
	// https proxy's certificate is checked as ProxyTLSConfig says);
	// socks5:// and socks5h:// proxies take a username and password from
	// the URL, and resolve the edge's name either way. DialContext dials
	// the proxy; TLS to the edge runs inside the tunnel. A failure of the
	// proxy wraps ErrProxy and names it, never its password. Nil:
	// ProxyFromEnvironment (HTTPS_PROXY, ALL_PROXY, NO_PROXY; never for an
	// edge on loopback). ProxyURL(u) sends every edge through u whatever
	// the environment says; ProxyURL(nil) never uses a proxy.
	Proxy func(edgeAddr string) (*url.URL, error)

	// ProxyTLSConfig is the configuration for TLS to an https:// proxy. An
	// empty ServerName stands for the host of the proxy's URL. Nil: the
	// system's roots.
	ProxyTLSConfig *tls.Config

	// HeartbeatInterval and HeartbeatTimeout set how often the agent pings
	// the edge and how long it waits, past the interval, for anything at
	// all from the edge before it closes the session. Zero: 30 s and 15 s. The pings also keep an idle session's
	// connection busy: proxies, NATs and firewalls on the way drop
	// connections idle for longer than their own timeout (often 60 s,
	// some 30 s), so keep the interval well below it. The edge's own
	// pings (edge.Timeouts.HeartbeatInterval) do the same from its side.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration

	// StreamWindow is the most unread bytes each stream buffers, at both
	// ends; the edge may grant less. Zero: 256 KiB; it is kept within
	// 64 KiB and 16 MiB.
	StreamWindow int

	// MinBackoff and MaxBackoff bound the wait before each round of
	// attempts (one attempt per edge, see Addrs), to reconnect or, within
	// Listen, to wait for the edge: it starts at MinBackoff and doubles up
	// to MaxBackoff, each wait drawn at random between half and all of
	// it. Zero: 250 ms and 30 s.
	MinBackoff time.Duration
	MaxBackoff time.Duration

	// OnEvent, if not nil, is called for each change of the session's
	// state, from the client's goroutines; it must not block. It is the
	// one place events go: an app that reacts to its session writes a
	// func, and metrics take theirs the same way (metrics.Agent's Event).
	// Nil: events are only logged.
	OnEvent func(Event)

	// Observer, if set, counts the public connections that reach the
	// client's listeners and their bytes (see Observer); the session's
	// events go to OnEvent. Nil: nothing is counted.
	Observer Observer

	// Logger receives the client's logs. Nil: they are discarded.
	Logger *slog.Logger

	connectMu sync.Mutex // serialises opening sessions
	// binding is held for reading from a bind request until its listener
	// is registered: a proxy stream for a tunnel ID not known yet waits for
	// the binds in flight (the edge may route to an endpoint before the
	// agent has read the answer to its bind).
	binding sync.RWMutex

	mu         sync.Mutex
	mux        *wire.Session // nil while disconnected
	edge       string        // the address of mux's edge
	next       int           // the index in edges() of the edge to try next
	sessionID  string
	version    int           // the protocol version of mux
	ticket     string        // the session ticket, for the next hello
	renewAfter time.Duration // how often endpoint tickets are renewed
	stopRenew  func()        // stops the renewals on mux; nil when none run
	listeners  map[*Listener]struct{}
	byTunnel   map[string]*Listener
	leaving    map[*wire.Session][]string // sessions asked to move off, until they end: their tunnels that moved
	farewells  map[*wire.Session]string   // why the edge said it ends a session (its GoAway), until it ends
	closed     bool
	ctx        context.Context // cancelled by Close
	cancel     context.CancelFunc
	redialing  bool
	wg         sync.WaitGroup
}

// Listen opens a session to the edge at edgeAddr and binds one endpoint
// there; see Endpoint.URL for endpoint. It waits for the edge within ctx,
// as Client.ListenEndpoint does. The session belongs to the listener:
// closing the listener closes it. It is a Client with Addrs holding
// edgeAddr alone; for several edges, or any other setting, use a Client.
func Listen(ctx context.Context, edgeAddr, endpoint string) (*Listener, error) {
	c := &Client{Addrs: []string{edgeAddr}}
	l, err := c.Listen(ctx, endpoint)
	if err != nil {
		c.Close()
		return nil, err
	}
	l.ownsClient = true
	return l, nil
}

// Listen binds the public endpoint named by url on the edge (see
// Endpoint.URL) and returns the listener its connections arrive on. It is
// ListenEndpoint with Endpoint{URL: url}.
func (c *Client) Listen(ctx context.Context, url string) (*Listener, error) {
	return c.ListenEndpoint(ctx, Endpoint{URL: url})
}

// ListenEndpoint binds ep on the edge and returns the listener its
// connections arrive on, opening the session first if none is open.
//
// It waits for its edge, within ctx, which bounds the setup only: while
// the attempts fail for reasons that may pass (nothing listens at the
// edge's address yet, the connection is refused, reset or closed, the
// edge does not answer, or answers ErrUnavailable: a restart under way, a
// limit reached), it tries again with the backoff of reconnections
// (MinBackoff, MaxBackoff; each edge of Addrs once a round), logging each
// failed attempt and telling it as a Reconnecting event. It fails at once
// on an endpoint URL or address list that is wrong, and after a round
// whose failures include one that waiting would not cure: ErrUnauthorized
// (and ErrNoToken), ErrNameTaken, ErrRefused, ErrNotAgentPort,
// ErrTLSExpected, ErrPlaintextExpected, the edge's certificate refused,
// ErrProxy (but for a proxy out of reach, or one that cannot reach the
// edge, which is waited for as an edge is). When ctx ends first, the error wraps its cause and the latest
// failure of each edge. A context without a deadline waits for good, or
// until Close, after which it fails with an error wrapping net.ErrClosed.
func (c *Client) ListenEndpoint(ctx context.Context, ep Endpoint) (*Listener, error) {
	bind, err := bindOf(ep)
	if err != nil {
		return nil, err
	}
	edges, err := c.edges()
	if err != nil {
		return nil, err
	}
	l, err := c.setup(ctx, bind, edges)
	if err == nil && ep.HealthCheck != nil {
		hc, _ := ep.HealthCheck.resolved() // bindOf checked it
		l.startHealth(&hc)
	}
	return l, err
}

// bindOf returns the bind request of ep, or what is wrong with ep.
func bindOf(ep Endpoint) (wire.Bind, error) {
	bind, err := parseEndpoint(ep.URL)
	if err != nil {
		return bind, err
	}
	bind.Pool = ep.Pool
	bind.Ticket = ep.Ticket
	switch ep.AppProtocol {
	case "", wire.AppProtocolHTTP1:
	case wire.AppProtocolH2C:
		if bind.Proto != wire.ProtoHTTP && bind.Proto != wire.ProtoHTTPS {
			return bind, fmt.Errorf("agent: endpoint %q: app protocol %q needs an http or https endpoint", ep.URL, ep.AppProtocol)
		}
		if bind.Options == nil {
			bind.Options = map[string]string{}
		}
		bind.Options[wire.OptAppProtocol] = ep.AppProtocol
	default:
		return bind, fmt.Errorf("agent: app protocol %q: want http1 or h2c", ep.AppProtocol)
	}
	if ep.VerboseErrors {
		if bind.Proto != wire.ProtoHTTP && bind.Proto != wire.ProtoHTTPS {
			return bind, fmt.Errorf("agent: endpoint %q: verbose errors need an http or https endpoint", ep.URL)
		}
		if bind.Options == nil {
			bind.Options = map[string]string{}
		}
		bind.Options[wire.OptVerboseErrors] = "true"
	}
	if err := bindPath(&bind, ep); err != nil {
		return bind, err
	}
	if err := bindPolicy(&bind, ep.Policy); err != nil {
		return bind, fmt.Errorf("agent: endpoint %q: %w", ep.URL, err)
	}
	if ep.HealthCheck != nil {
		if _, err := ep.HealthCheck.resolved(); err != nil {
			return bind, fmt.Errorf("agent: endpoint %q: %w", ep.URL, err)
		}
		if bind.Options == nil {
			bind.Options = map[string]string{}
		}
		bind.Options[wire.OptHealthCheck] = "1"
	}
	return bind, nil
}

// initLocked makes the maps and the context of a client at its first use.
// c.mu is held.
func (c *Client) initLocked() {
	if c.listeners == nil {
		c.ticket = c.ResumeTicket
		c.listeners = map[*Listener]struct{}{}
		c.byTunnel = map[string]*Listener{}
		c.ctx, c.cancel = context.WithCancel(context.Background())
	}
}

// Ticket returns the session ticket the edge gave the latest session, to
// keep for a later Client's ResumeTicket; before the first session,
// ResumeTicket. It changes at each session (Connected event), and when the
// edge renews it during one (TicketRenewed event): keep the latest.
func (c *Client) Ticket() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listeners == nil {
		return c.ResumeTicket
	}
	return c.ticket
}

// Close unbinds every listener, ends the session and waits for the
// client's goroutines. Listeners' Accept then returns an error wrapping
// net.ErrClosed. It is safe to call more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	c.initLocked()
	if c.closed {
		c.mu.Unlock()
		c.wg.Wait()
		return nil
	}
	c.closed = true
	c.cancel()
	ls := make([]*Listener, 0, len(c.listeners))
	for l := range c.listeners {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	for _, l := range ls {
		l.shut()
		c.unbind(l)
	}
	c.mu.Lock()
	mux, edge := c.mux, c.edge
	for m := range c.leaving {
		m.Close()
	}
	c.mu.Unlock()
	if mux != nil {
		mux.Close()
		c.emit(Event{Kind: Disconnected, Err: net.ErrClosed, Addr: edge})
	}
	c.wg.Wait()
	return nil
}

func (c *Client) log() *slog.Logger {
	if c.Logger == nil {
		return discard
	}
	return c.Logger
}

var discard = slog.New(slog.DiscardHandler)
