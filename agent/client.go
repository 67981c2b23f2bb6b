package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
)

// Errors of the agent. Errors from the edge wrap one of these, so callers
// can tell them apart with errors.Is.
var (
	// ErrUnauthorized: the edge refused the token.
	ErrUnauthorized = errors.New("agent: edge refused the token")
	// ErrNameTaken: the name belongs to another identity, or is bound
	// already by this one without a pool (see Endpoint.Pool).
	ErrNameTaken = errors.New("agent: name taken")
	// ErrUnavailable: the edge cannot grant the request now (no free port,
	// a limit reached, a restart under way); trying again later may work.
	ErrUnavailable = errors.New("agent: edge unavailable")
	// ErrRefused: the edge refused the request for another reason (a bad
	// name, an unsupported version); trying again will not help.
	ErrRefused = errors.New("agent: edge refused the request")
)

// Client is one session to an edge, carrying any number of listeners. Its
// zero value with Addr (or Addrs) set is ready to use: the session is
// opened by the first Listen. Given several edges, it holds a session to
// one of them at a time (see Addrs). When the session ends while listeners
// are open, the client reconnects on its own, with exponential backoff and
// jitter, forever until closed, and binds every listener's endpoint again
// with the same name: the listeners stay open across the gap. The edge's
// session ticket makes the new session take over the old one's endpoints
// at once, even when the edge has not yet noticed that the old one died;
// endpoint tickets get the names back after the edge restarted. A bind the
// edge cannot grant for now is tried again with backoff; only a name lost
// for good (ErrNameTaken, ErrRefused) ends a listener, whose Accept then
// returns that error. Opening a session to one edge (the dial, TLS, the
// hello) takes at most 10 s, within the context given to Listen. A Client
// must not be copied, nor its fields changed, after first use.
type Client struct {
	// Addr is the edge's agent address, "host:port". With Addrs, it is the
	// first edge tried. Empty: Addrs alone.
	Addr string

	// Addrs are the agent addresses of more edges, "host:port" each, tried
	// after Addr, in order: edges that share their names (a cluster behind
	// DNS), so that an endpoint comes back with the same name on any of
	// them. The client holds a session to one edge at a time. The first
	// goes to the first edge that takes it: when an attempt fails (the
	// dial, TLS, the hello, or no answer within 10 s), the next edge is
	// tried at once. When a session ends, the client reconnects to the
	// edge after the one it was on (that one may be the edge that died),
	// and so on through the list, wrapping around. Each round of attempts,
	// one per edge, starts after the backoff wait (see MinBackoff); within
	// a round, a failed attempt moves on to the next edge at once. A
	// listener's URL is then the one the new edge answered (Listener.URL).
	// An address listed twice is tried once per round; empty ones are left
	// out. Nil: Addr alone.
	Addrs []string

	// Token is presented to the edge in the hello. Empty: none.
	Token string

	// TLSConfig is the configuration for TLS to the edges. An empty
	// ServerName stands for the host of each edge's address, as with
	// tls.Dial; set one only when every edge's certificate carries it. Nil:
	// TLS with the system's roots and each edge's host as the server name,
	// except that a loopback edge ("127.0.0.1:7000", "localhost:7000") is
	// plaintext.
	TLSConfig *tls.Config

	// Plaintext connects without TLS, whatever the edges' addresses are.
	// Use it only for edges behind a TLS-terminating proxy or on a private
	// network.
	Plaintext bool

	// DialContext opens the TCP connection to the edge, or to the proxy
	// when there is one (see Proxy). Nil: a net.Dialer.
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
	// the edge and how long it waits for an answer before it closes the
	// session. Zero: 10 s and 15 s. The pings also keep an idle session's
	// connection busy: proxies, NATs and firewalls on the way drop
	// connections idle for longer than their own timeout (often 60 s,
	// some 30 s), so keep the interval well below it. The edge's own
	// pings (edge.Server.HeartbeatInterval) do the same from its side.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration

	// StreamWindow is the most unread bytes each stream buffers, at both
	// ends; the edge may grant less. Zero: 256 KiB; it is kept within
	// 64 KiB and 16 MiB.
	StreamWindow int

	// MinBackoff and MaxBackoff bound the wait before each round of
	// reconnection attempts (one attempt per edge, see Addrs): it starts at
	// MinBackoff and doubles up to MaxBackoff, each wait drawn at random
	// between half and all of it. Zero: 250 ms and 30 s.
	MinBackoff time.Duration
	MaxBackoff time.Duration

	// OnEvent, if not nil, is called for each change of the session's
	// state, from the client's goroutines; it must not block.
	OnEvent func(Event)

	// Observer, if set, hears what happens on the client, to count it
	// (see Observer). Nil: nothing is counted.
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
	ticket     string        // the session ticket, for the next hello
	renewAfter time.Duration // how often endpoint tickets are renewed
	listeners  map[*Listener]struct{}
	byTunnel   map[string]*Listener
	closed     bool
	ctx        context.Context // cancelled by Close
	cancel     context.CancelFunc
	redialing  bool
	wg         sync.WaitGroup
}

// EventKind says what happened to a client's session.
type EventKind int

// The kinds of events.
const (
	// Connected: a session is open (again); listeners are bound.
	Connected EventKind = iota + 1
	// Disconnected: the session ended; Err says why.
	Disconnected
	// Reconnecting: an attempt starts after Delay; Err is why the previous
	// attempt failed, if one did. With several edges, Delay is the backoff
	// for the first attempt of a round and zero for the others.
	Reconnecting
)

func (k EventKind) String() string {
	switch k {
	case Connected:
		return "connected"
	case Disconnected:
		return "disconnected"
	case Reconnecting:
		return "reconnecting"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is a change of a client's session state.
type Event struct {
	Kind    EventKind
	Err     error         // the cause, for Disconnected and failed attempts
	Attempt int           // for Reconnecting: 1 for the first attempt
	Delay   time.Duration // for Reconnecting: the wait before the attempt
	// Addr is the edge's address: the one connected to (Connected), the
	// one whose session ended (Disconnected), or the one the attempt will
	// try unless a session was opened meanwhile (Reconnecting).
	Addr string
}

// Listen opens a session to the edge at edgeAddr and binds one endpoint
// there; see Endpoint.URL for endpoint. The session belongs to the
// listener: closing the listener closes it. For several edges, use a
// Client with Addrs.
func Listen(ctx context.Context, edgeAddr, endpoint string) (*Listener, error) {
	c := &Client{Addr: edgeAddr}
	l, err := c.Listen(ctx, endpoint)
	if err != nil {
		c.Close()
		return nil, err
	}
	l.ownsClient = true
	return l, nil
}

// Endpoint describes a public endpoint to bind on the edge.
type Endpoint struct {
	// URL names the endpoint:
	//   - "http://abc", "abc" or "http://abc.example.test": HTTP requests for
	//     abc under the edge's domain; "" or "http://": a random name.
	//   - "https://abc" or "https://abc.example.test": the same, with TLS
	//     terminated at the edge (its certificate, HTTP/2 or HTTP/1.1 by
	//     ALPN); the app gets plain HTTP, with X-Forwarded-Proto https.
	//   - "tls://app.example.test", "tls://*.app.example.test": TLS
	//     connections whose server name matches, passed through untouched
	//     (the app terminates TLS).
	//   - "tcp://" for any free port, "tcp://:20001" for that port.
	// A port in an http, https or tls URL is ignored: the edge's ports
	// apply.
	URL string

	// AppProtocol is what the edge speaks to the app on an http or https
	// endpoint's conns: "" or "http1" for HTTP/1.1, "h2c" for HTTP/2
	// without TLS (prior knowledge), which gRPC services need for their
	// streams and trailers. Public clients may use HTTP/1.1 or HTTP/2
	// either way.
	AppProtocol string

	// Pool joins the endpoint when this agent's identity already holds
	// it, so that several sessions share its connections, rather than
	// fail with ErrNameTaken.
	Pool bool

	// Policy is the traffic policy the edge enforces on the endpoint's
	// connections and requests before they reach the listener (see
	// package policy): client addresses, rate limits, logins, webhook
	// signatures, headers. It is checked against the endpoint's protocol
	// before the bind, and sent with it (its secrets included: use TLS to
	// the edge). An edge that cannot enforce all of it refuses the
	// endpoint (ErrRefused) rather than serve it without. Nil: none.
	Policy *policy.Spec
}

// Listen binds the public endpoint named by url on the edge (see
// Endpoint.URL) and returns the listener its connections arrive on. ctx
// bounds the setup only.
func (c *Client) Listen(ctx context.Context, url string) (*Listener, error) {
	return c.ListenEndpoint(ctx, Endpoint{URL: url})
}

// ListenEndpoint binds ep on the edge and returns the listener its
// connections arrive on. ctx bounds the setup only.
func (c *Client) ListenEndpoint(ctx context.Context, ep Endpoint) (*Listener, error) {
	bind, err := parseEndpoint(ep.URL)
	if err != nil {
		return nil, err
	}
	bind.Pool = ep.Pool
	switch ep.AppProtocol {
	case "", wire.AppProtocolHTTP1:
	case wire.AppProtocolH2C:
		if bind.Proto != wire.ProtoHTTP && bind.Proto != wire.ProtoHTTPS {
			return nil, fmt.Errorf("agent: endpoint %q: app protocol %q needs an http or https endpoint", ep.URL, ep.AppProtocol)
		}
		bind.Options = map[string]string{wire.OptAppProtocol: ep.AppProtocol}
	default:
		return nil, fmt.Errorf("agent: app protocol %q: want http1 or h2c", ep.AppProtocol)
	}
	if err := bindPolicy(&bind, ep.Policy); err != nil {
		return nil, fmt.Errorf("agent: endpoint %q: %w", ep.URL, err)
	}
	mux, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	c.binding.RLock()
	defer c.binding.RUnlock()
	resp, err := c.bind(ctx, mux, bind)
	if err != nil {
		return nil, err
	}
	l := &Listener{
		c:     c,
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
	}
	l.setBound(mux, bind, resp)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("agent: %w", net.ErrClosed)
	}
	c.listeners[l] = struct{}{}
	c.byTunnel[resp.TunnelID] = l
	edge := c.edge
	c.mu.Unlock()
	c.log().Info("listening", "url", resp.URL, "edge", edge)
	return l, nil
}

func (c *Client) bind(ctx context.Context, mux *wire.Session, b wire.Bind) (*wire.BindResp, error) {
	var resp wire.Response
	if err := c.call(ctx, mux, wire.Request{Op: wire.OpBind, Bind: &b}, &resp); err != nil {
		return nil, err
	}
	if resp.BindResp == nil {
		return nil, fmt.Errorf("%w: bind answered without an endpoint", ErrRefused)
	}
	return resp.BindResp, nil
}

// parseEndpoint turns an endpoint URL into a bind request.
func parseEndpoint(endpoint string) (wire.Bind, error) {
	b := wire.Bind{Proto: wire.ProtoHTTP}
	if endpoint == "" {
		return b, nil
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return b, fmt.Errorf("agent: endpoint %q: %w", endpoint, err)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
		return b, fmt.Errorf("agent: endpoint %q: want scheme://name only", endpoint)
	}
	switch u.Scheme {
	case wire.ProtoHTTP, wire.ProtoHTTPS, wire.ProtoTLS:
		b.Proto = u.Scheme
		b.Name = u.Hostname()
		if b.Proto == wire.ProtoTLS && b.Name == "" {
			return b, fmt.Errorf("agent: endpoint %q: a tls endpoint needs a name", endpoint)
		}
	case wire.ProtoTCP:
		b.Proto = wire.ProtoTCP
		if u.Hostname() != "" && u.Port() == "" {
			return b, fmt.Errorf("agent: endpoint %q: want tcp:// or tcp://:PORT", endpoint)
		}
		if p := u.Port(); p != "" {
			port, err := strconv.Atoi(p)
			if err != nil || port < 1 || port > 65535 {
				return b, fmt.Errorf("agent: endpoint %q: bad port", endpoint)
			}
			b.Port = port
		}
	default:
		return b, fmt.Errorf("agent: endpoint %q: unsupported scheme %q (want http, https, tls or tcp)", endpoint, u.Scheme)
	}
	return b, nil
}

// bindPolicy adds spec, checked against the bind's protocol, to b. A nil or
// empty spec adds nothing.
func bindPolicy(b *wire.Bind, spec *policy.Spec) error {
	if spec.IsZero() {
		return nil
	}
	if err := spec.Validate(b.Proto); err != nil {
		return err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if len(raw) > policy.MaxSpecBytes {
		return fmt.Errorf("%w: %d bytes of JSON (at most %d)", policy.ErrTooLarge, len(raw), policy.MaxSpecBytes)
	}
	b.Policy = raw
	if b.Options == nil {
		b.Options = map[string]string{}
	}
	b.Options[wire.OptPolicy] = wire.PolicyVersion
	return nil
}

// session returns the open session, opening one first if needed.
func (c *Client) session(ctx context.Context) (*wire.Session, error) {
	c.connectMu.Lock()
	defer c.connectMu.Unlock()
	c.mu.Lock()
	c.initLocked()
	closed, mux := c.closed, c.mux
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("agent: %w", net.ErrClosed)
	}
	if mux != nil {
		return mux, nil
	}
	return c.connectAny(ctx)
}

func (c *Client) initLocked() {
	if c.listeners == nil {
		c.listeners = map[*Listener]struct{}{}
		c.byTunnel = map[string]*Listener{}
		c.ctx, c.cancel = context.WithCancel(context.Background())
	}
}

// connect opens a session to the edge at addr, within ctx and
// edgeTimeout, and logs a failure. The caller holds connectMu.
func (c *Client) connect(ctx context.Context, addr string) (*wire.Session, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, edgeTimeout, errEdgeTimeout)
	defer cancel()
	mux, err := c.open(ctx, addr)
	if err != nil && c.ctx.Err() == nil {
		c.log().Warn("connecting to edge failed", "edge", addr, "err", err)
	}
	return mux, err
}

// open opens a session: the transport, the mux, the hello. It installs
// the session and starts its goroutines.
func (c *Client) open(ctx context.Context, addr string) (*wire.Session, error) {
	// Proxy hook (dial.go): the edge directly, or through Client.Proxy.
	conn, err := c.dialEdge(ctx, addr)
	if err != nil {
		return nil, err
	}
	tlsCfg := c.tlsConfig(addr)
	if tlsCfg != nil {
		tc := tls.Client(conn, tlsCfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("agent: TLS to edge: %w", ctxErr(ctx, err))
		}
		conn = tc
	}
	window, err := c.preamble(ctx, conn)
	if err != nil {
		conn.Close()
		if tlsCfg == nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (over plaintext: does the edge expect TLS?)", err)
		}
		return nil, fmt.Errorf("agent: %w", ctxErr(ctx, err))
	}
	// The edge opens a stream per public connection: a burst of them must
	// not overflow muxado's accept queue (128 by default), which resets
	// the streams it cannot queue.
	mux := wire.NewSession(conn, window, true, 1024)
	// Streams whose public clients stopped reading hold the app's bytes
	// on this host (the app's socket buffers above all): past a bound,
	// the one stalled the longest is cut, and with it the connection to
	// the app.
	mux.LimitStalled(wire.DefaultMaxStalled, wire.StallAfter, func(st *wire.Stream) {
		c.log().Debug("stream cut: its client stopped reading, and the session holds its bound of stalled streams", "edge", addr, "max", wire.DefaultMaxStalled)
	})
	mux.LimitUnread(wire.DefaultMaxUnread, nil)
	// Serve the edge's streams before the hello, so that its heartbeat is
	// answered from the start.
	accepting := make(chan struct{})
	dead := make(chan struct{}) // closed when the session ends
	c.wg.Go(func() { c.acceptLoop(mux, addr, accepting, dead) })
	var resp wire.Response
	c.mu.Lock()
	ticket := c.ticket
	c.mu.Unlock()
	hello := wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: c.Token, Agent: "tunnelkit-agent", Ticket: ticket}}
	err = c.call(ctx, mux, hello, &resp)
	if err == nil && resp.HelloResp == nil {
		err = fmt.Errorf("%w: hello answered without a session", ErrRefused)
	}
	if err != nil && tlsCfg == nil && ctx.Err() == nil && !errors.Is(err, ErrUnauthorized) && !errors.Is(err, ErrRefused) {
		err = fmt.Errorf("%w (over plaintext: does the edge expect TLS?)", err)
	}
	c.mu.Lock()
	if err == nil && c.closed {
		err = fmt.Errorf("agent: %w", net.ErrClosed)
	}
	if err != nil {
		c.mu.Unlock()
		close(accepting)
		mux.Close()
		return nil, err
	}
	c.mux = mux
	c.edge = addr
	c.sessionID = resp.HelloResp.SessionID
	if resp.HelloResp.Ticket != "" {
		c.ticket = resp.HelloResp.Ticket
	}
	c.renewAfter = time.Duration(resp.HelloResp.RenewAfter) * time.Second
	c.wg.Go(func() { c.heartbeat(mux, addr) })
	if renew := c.renewAfter; renew > 0 {
		c.wg.Go(func() { c.renewLoop(mux, renew, dead) })
	}
	c.mu.Unlock()
	close(accepting)
	c.log().Info("connected to edge", "edge", addr, "session", resp.HelloResp.SessionID)
	c.emit(Event{Kind: Connected, Addr: addr})
	return mux, nil
}

// preamble asks the edge for the stream window and returns the one it
// grants, within ctx.
func (c *Client) preamble(ctx context.Context, conn net.Conn) (uint32, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := wire.WritePreamble(conn, wire.ClampWindow(c.StreamWindow)); err != nil {
		return 0, err
	}
	window, err := wire.ReadPreamble(conn)
	if err != nil {
		return 0, err
	}
	if !stop() {
		return 0, ctx.Err()
	}
	return window, conn.SetDeadline(time.Time{})
}

// call sends one control request on its own stream and reads the answer.
// ctx bounds it: when ctx ends first, the stream is closed.
func (c *Client) call(ctx context.Context, mux *wire.Session, req wire.Request, resp *wire.Response) error {
	st, err := mux.OpenStream()
	if err != nil {
		return fmt.Errorf("agent: %s: %w", req.Op, err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	if err := wire.WriteMessage(st, []byte{byte(wire.StreamControl)}, req); err != nil {
		return fmt.Errorf("agent: %s: %w", req.Op, ctxErr(ctx, err))
	}
	if err := wire.ReadMessage(st, resp); err != nil {
		return fmt.Errorf("agent: %s: %w", req.Op, ctxErr(ctx, err))
	}
	if e := resp.Error; e != nil {
		sentinel := ErrRefused
		switch e.Code {
		case wire.CodeUnauthorized:
			sentinel = ErrUnauthorized
		case wire.CodeNameTaken:
			sentinel = ErrNameTaken
		case wire.CodeUnavailable:
			sentinel = ErrUnavailable
		}
		return fmt.Errorf("%w: %s", sentinel, wire.Printable(e.Message, 200))
	}
	return nil
}

// ctxErr returns why ctx ended, if it did, else err.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// acceptLoop accepts the edge's streams until the session ends, then
// closes dead. Proxy streams wait for accepting, closed once the session is
// installed.
func (c *Client) acceptLoop(mux *wire.Session, addr string, accepting <-chan struct{}, dead chan struct{}) {
	var wg sync.WaitGroup
	for {
		st, err := mux.AcceptStream()
		if err != nil {
			break
		}
		wg.Go(func() { c.handleStream(st, addr, accepting, dead) })
	}
	close(dead)
	wg.Wait()
	c.sessionEnded(mux)
}

// sessionEnded forgets a session that died and reconnects when listeners
// are open.
func (c *Client) sessionEnded(mux *wire.Session) {
	localErr, _, _ := mux.Wait()
	c.mu.Lock()
	if c.mux != mux {
		c.mu.Unlock()
		return
	}
	c.mux = nil
	edge := c.edge
	c.byTunnel = map[string]*Listener{}
	closed := c.closed
	redial := !closed && len(c.listeners) > 0 && !c.redialing
	if redial {
		c.redialing = true
	}
	c.mu.Unlock()
	if !closed {
		// Disconnected comes before any event of the reconnection.
		c.log().Warn("session to edge ended", "edge", edge, "err", localErr)
		c.emit(Event{Kind: Disconnected, Err: localErr, Addr: edge})
	}
	if redial {
		c.wg.Go(c.reconnectLoop)
	}
}

// reconnectLoop opens a new session and binds every open listener again,
// until it succeeds or the client closes. It goes in rounds of one attempt
// per edge, from the edge after the one the session was on: the first
// attempt of a round after the backoff wait, the others at once. A round
// ends early when a session is open but some endpoints are not granted yet.
func (c *Client) reconnectLoop() {
	defer func() {
		c.mu.Lock()
		c.redialing = false
		c.mu.Unlock()
	}()
	minB, maxB := c.MinBackoff, c.MaxBackoff
	if minB <= 0 {
		minB = 250 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 30 * time.Second
	}
	backoff := minB
	var lastErr error
	attempt := 0
	for {
		delay := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, maxB)
		edges, err := c.edges()
		if err != nil {
			edges = []string{""} // rebindAll fails with err, once a round
		}
		for i := range edges {
			attempt++
			if i > 0 {
				delay = 0
			}
			addr := c.nextEdge(edges)
			c.log().Info("reconnecting", "edge", addr, "attempt", attempt, "in", delay.Round(time.Millisecond))
			c.emit(Event{Kind: Reconnecting, Attempt: attempt, Delay: delay, Err: lastErr, Addr: addr})
			if delay > 0 {
				t := time.NewTimer(delay)
				select {
				case <-c.ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
			up, err := c.rebindAll(ctx)
			cancel()
			if err == nil || c.ctx.Err() != nil {
				return
			}
			lastErr = err
			if up {
				// The session is fine; its endpoints wait for the backoff.
				c.log().Warn("reconnect failed", "edge", addr, "attempt", attempt, "err", err)
				break
			}
			// connect logged the failure; on to the next edge.
		}
	}
}

// rebindAll opens a session, to the next edge, if none is open, and binds
// each open listener's endpoint that is not bound on it. A listener whose
// endpoint is refused for good (its name taken by another identity, or
// refused) is closed with that error; one the edge cannot grant for now
// stays open and unbound, and rebindAll returns that error, with up true,
// so that it is tried again on the same session. A failure of the session
// itself closes it (up false).
func (c *Client) rebindAll(ctx context.Context) (up bool, err error) {
	c.connectMu.Lock()
	defer c.connectMu.Unlock()
	c.mu.Lock()
	mux, edge, closed := c.mux, c.edge, c.closed
	c.mu.Unlock()
	if closed {
		return false, nil
	}
	if mux == nil {
		edges, err := c.edges()
		if err != nil {
			return false, err
		}
		edge = c.takeEdge(edges)
		if mux, err = c.connect(ctx, edge); err != nil {
			return false, err
		}
	}
	c.mu.Lock()
	ls := make([]*Listener, 0, len(c.listeners))
	for l := range c.listeners {
		if _, ok := l.bound(mux); !ok {
			ls = append(ls, l)
		}
	}
	c.mu.Unlock()
	c.binding.RLock()
	defer c.binding.RUnlock()
	var later error
	for _, l := range ls {
		b := l.rebindRequest()
		resp, err := c.bind(ctx, mux, b)
		switch {
		case err == nil:
		case errors.Is(err, ErrNameTaken) || errors.Is(err, ErrRefused):
			c.log().Warn("endpoint lost", "url", l.URL(), "err", err)
			c.mu.Lock()
			delete(c.listeners, l)
			c.mu.Unlock()
			l.fail(err)
			continue
		case errors.Is(err, ErrUnavailable):
			c.log().Info("endpoint not granted yet; will try again", "url", l.URL(), "err", err)
			later = err
			continue
		default:
			c.log().Warn("rebinding failed; closing the session", "edge", edge, "url", l.URL(), "err", err)
			mux.Close() // try again with a new session
			return false, err
		}
		if resp.URL != l.URL() {
			c.log().Warn("endpoint came back under another URL", "was", l.URL(), "now", resp.URL, "edge", edge)
		}
		l.setBound(mux, b, resp)
		c.mu.Lock()
		c.byTunnel[resp.TunnelID] = l
		c.mu.Unlock()
	}
	return true, later
}

// renewLoop renews the endpoint tickets of the listeners bound on mux every
// interval, until the session ends or the client closes.
func (c *Client) renewLoop(mux *wire.Session, interval time.Duration, dead <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-dead:
			return
		case <-c.ctx.Done():
			return
		}
		c.mu.Lock()
		ls := make([]*Listener, 0, len(c.listeners))
		for l := range c.listeners {
			ls = append(ls, l)
		}
		c.mu.Unlock()
		for _, l := range ls {
			id, ok := l.bound(mux)
			if !ok {
				continue
			}
			ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
			var resp wire.Response
			err := c.call(ctx, mux, wire.Request{Op: wire.OpRenew, Renew: &wire.Renew{TunnelID: id}}, &resp)
			cancel()
			if err == nil && resp.RenewResp != nil {
				l.setTicket(resp.RenewResp.Ticket)
			} else if err != nil {
				c.log().Debug("renew endpoint ticket", "url", l.URL(), "err", err)
			}
		}
	}
}

// handleStream reads the header of a stream the edge opened and hands it to
// its listener.
// A stream waiting for Accept is dropped when dead is closed.
func (c *Client) handleStream(st *wire.Stream, addr string, accepting, dead <-chan struct{}) {
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var t [1]byte
	if _, err := io.ReadFull(st, t[:]); err != nil {
		st.Close()
		return
	}
	switch wire.StreamType(t[0]) {
	case wire.StreamHeartbeat:
		st.SetReadDeadline(time.Time{})
		wire.Echo(st)
		st.Close()
	case wire.StreamGoAway:
		var g wire.GoAway
		err := wire.ReadMessage(st, &g)
		st.Close()
		if err == nil {
			c.log().Info("edge is going away; will reconnect when the session ends", "edge", addr, "reason", wire.Printable(g.Message, 200))
		}
	case wire.StreamProxy:
		h, err := wire.ReadProxyHeader(st)
		st.SetReadDeadline(time.Time{})
		if err != nil {
			c.log().Warn("bad proxy header from edge", "err", err)
			st.Close()
			return
		}
		select {
		case <-accepting:
		case <-c.ctx.Done():
			st.Close()
			return
		}
		conn := newConn(st, h, c.Observer)
		l := c.listener(h.TunnelID)
		if l == nil {
			// Perhaps its bind is still in flight: wait for the binds
			// under way, then look again.
			c.binding.Lock()
			l = c.listener(h.TunnelID)
			c.binding.Unlock()
		}
		if l == nil {
			conn.refuse(wire.ReplyNoEndpoint, "no listener for this endpoint")
			return
		}
		l.deliver(conn, dead)
	default:
		c.log().Warn("unexpected stream type from edge", "type", t[0])
		st.Close()
	}
}

func (c *Client) listener(tunnelID string) *Listener {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byTunnel[tunnelID]
}

// heartbeat pings the edge and closes the session when it stops answering.
func (c *Client) heartbeat(mux *wire.Session, addr string) {
	st, err := mux.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	if _, err := st.Write([]byte{byte(wire.StreamHeartbeat)}); err != nil {
		return
	}
	hb := wire.Heartbeat{
		Interval: c.HeartbeatInterval,
		Timeout:  c.HeartbeatTimeout,
		Heard:    mux.Heard,
		Dead: func() {
			c.log().Warn("edge missed its heartbeat; closing the session", "edge", addr)
			mux.Close()
		},
	}
	hb.Run(st)
}

// unbind releases a listener's endpoint on the edge, if the session is up.
func (c *Client) unbind(l *Listener) {
	c.mu.Lock()
	mux := c.mux
	delete(c.listeners, l)
	id := l.tunnelID
	if c.byTunnel[id] == l {
		delete(c.byTunnel, id)
	}
	c.mu.Unlock()
	if mux == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var resp wire.Response
	if err := c.call(ctx, mux, wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: id}}, &resp); err != nil {
		c.log().Debug("unbind", "url", l.URL(), "err", err)
	}
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
	c.mu.Unlock()
	if mux != nil {
		mux.Close()
		c.emit(Event{Kind: Disconnected, Err: net.ErrClosed, Addr: edge})
	}
	c.wg.Wait()
	return nil
}

func (c *Client) emit(e Event) {
	if c.Observer != nil {
		c.Observer.Event(e)
	}
	if c.OnEvent != nil {
		c.OnEvent(e)
	}
}

// Observer hears what happens on a Client, to count it: package
// github.com/tunnelkit/tunnelkit/metrics turns it into Prometheus
// metrics. Its methods are called from many goroutines at once: they must
// be cheap and safe for concurrent use, and must not block.
type Observer interface {
	// Event is called for each change of the session's state, as OnEvent.
	Event(Event)
	// Conn is called when a public connection reaches one of the client's
	// listeners, with its endpoint's protocol (http, https, tls, tcp).
	Conn(proto string)
	// Bytes is called when such a connection is closed, with the bytes
	// read from the client (in) and written to it (out).
	Bytes(proto string, in, out int64)
}

func (c *Client) log() *slog.Logger {
	if c.Logger == nil {
		return discard
	}
	return c.Logger
}

var discard = slog.New(slog.DiscardHandler)
