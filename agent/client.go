package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Errors of the agent. Errors from the edge wrap one of these, so callers
// can tell them apart with errors.Is.
var (
	ErrClosed       = net.ErrClosed
	ErrUnauthorized = errors.New("agent: edge refused the token")
	ErrNameTaken    = errors.New("agent: name taken")
	ErrRefused      = errors.New("agent: edge refused the request")
)

// Client is one session to an edge, carrying any number of listeners. Its
// zero value with Addr set is ready to use: the session is opened by the
// first Listen. A Client must not be copied after first use.
type Client struct {
	// Addr is the edge's agent address, "host:port".
	Addr string

	// Token is presented to the edge in the hello. Empty: none.
	Token string

	// DialContext opens the transport to the edge. Nil: a net.Dialer.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// HeartbeatInterval and HeartbeatTimeout set how often the agent pings
	// the edge and how long it waits for an answer before it closes the
	// session. Zero: 10 s and 15 s.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration

	// Logger receives the client's logs. Nil: they are discarded.
	Logger *slog.Logger

	mu        sync.Mutex
	mux       muxado.Session
	sessionID string
	listeners map[string]*Listener // by tunnel ID
	closed    bool
	wg        sync.WaitGroup
}

// Listen opens a session to the edge at edgeAddr and binds one endpoint
// there; see Client.Listen for endpoint. The session belongs to the
// listener: closing the listener closes it.
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

// Listen binds a public endpoint on the edge and returns the listener its
// connections arrive on. endpoint names it: "http://abc.example.test",
// "http://abc" or "abc" ask for the name abc under the edge's domain; ""
// or "http://" ask for a random name. ctx bounds the setup only.
func (c *Client) Listen(ctx context.Context, endpoint string) (*Listener, error) {
	bind, err := parseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	mux, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	var resp wire.Response
	if err := c.call(ctx, mux, wire.Request{Op: wire.OpBind, Bind: &bind}, &resp); err != nil {
		return nil, err
	}
	if resp.BindResp == nil {
		return nil, fmt.Errorf("%w: bind answered without an endpoint", ErrRefused)
	}
	l := &Listener{
		c:        c,
		tunnelID: resp.BindResp.TunnelID,
		url:      resp.BindResp.URL,
		conns:    make(chan net.Conn),
		done:     make(chan struct{}),
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("agent: %w", net.ErrClosed)
	}
	c.listeners[l.tunnelID] = l
	c.mu.Unlock()
	c.log().Info("listening", "url", l.url)
	return l, nil
}

// parseEndpoint turns Listen's endpoint argument into a bind request.
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
	if u.Scheme != "http" {
		return b, fmt.Errorf("agent: endpoint %q: unsupported scheme %q", endpoint, u.Scheme)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
		return b, fmt.Errorf("agent: endpoint %q: want scheme://name only", endpoint)
	}
	// The name is the leftmost label; the edge adds its own domain.
	b.Name, _, _ = strings.Cut(u.Hostname(), ".")
	return b, nil
}

// session returns the open session, opening it first if needed.
func (c *Client) session(ctx context.Context) (muxado.Session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("agent: %w", net.ErrClosed)
	}
	if c.mux != nil {
		return c.mux, nil
	}
	if c.Addr == "" {
		return nil, errors.New("agent: Client.Addr is empty")
	}
	dial := c.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conn, err := dial(ctx, "tcp", c.Addr)
	if err != nil {
		return nil, fmt.Errorf("agent: dial edge: %w", err)
	}
	mux := muxado.Client(conn, &muxado.Config{})
	if c.listeners == nil {
		c.listeners = map[string]*Listener{}
	}
	// Serve the edge's streams before the hello, so its heartbeat is
	// answered from the start.
	c.wg.Go(func() { c.acceptLoop(mux) })
	var resp wire.Response
	hello := wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: c.Token, Agent: "tunnelkit-agent"}}
	if err := c.call(ctx, mux, hello, &resp); err != nil {
		mux.Close()
		return nil, err
	}
	if resp.HelloResp == nil {
		mux.Close()
		return nil, fmt.Errorf("%w: hello answered without a session", ErrRefused)
	}
	c.mux = mux
	c.sessionID = resp.HelloResp.SessionID
	c.wg.Go(func() { c.heartbeat(mux) })
	c.log().Info("connected to edge", "edge", c.Addr, "session", c.sessionID)
	return mux, nil
}

// call sends one control request on its own stream and reads the answer.
// ctx bounds it: when ctx ends first, the stream is closed.
func (c *Client) call(ctx context.Context, mux muxado.Session, req wire.Request, resp *wire.Response) error {
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
		}
		return fmt.Errorf("%w: %s", sentinel, printable(e.Message))
	}
	return nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// acceptLoop accepts the edge's streams until the session ends.
func (c *Client) acceptLoop(mux muxado.Session) {
	var wg sync.WaitGroup
	for {
		st, err := mux.AcceptStream()
		if err != nil {
			break
		}
		wg.Go(func() { c.handleStream(st) })
	}
	wg.Wait()
	c.sessionEnded(mux)
}

// sessionEnded forgets a session that died and ends its listeners.
func (c *Client) sessionEnded(mux muxado.Session) {
	c.mu.Lock()
	if c.mux != mux {
		c.mu.Unlock()
		return
	}
	c.mux = nil
	ls := c.listeners
	c.listeners = map[string]*Listener{}
	closed := c.closed
	c.mu.Unlock()
	if !closed {
		c.log().Warn("session to edge ended", "edge", c.Addr)
	}
	for _, l := range ls {
		l.shut()
	}
}

// handleStream reads the header of a stream the edge opened and hands it to
// its listener.
func (c *Client) handleStream(st muxado.Stream) {
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
	case wire.StreamProxy:
		h, err := wire.ReadProxyHeader(st)
		st.SetReadDeadline(time.Time{})
		if err != nil {
			c.log().Warn("bad proxy header from edge", "err", err)
			st.Close()
			return
		}
		c.mu.Lock()
		l := c.listeners[h.TunnelID]
		c.mu.Unlock()
		if l == nil {
			st.Close()
			return
		}
		l.deliver(newConn(st, h))
	default:
		c.log().Warn("unexpected stream type from edge", "type", t[0])
		st.Close()
	}
}

// heartbeat pings the edge and closes the session when it stops answering.
func (c *Client) heartbeat(mux muxado.Session) {
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
		Dead: func() {
			c.log().Warn("edge missed its heartbeat; closing the session", "edge", c.Addr)
			mux.Close()
		},
	}
	hb.Run(st)
}

// unbind releases a listener's endpoint on the edge, if the session is up.
func (c *Client) unbind(l *Listener) {
	c.mu.Lock()
	mux := c.mux
	if c.listeners[l.tunnelID] == l {
		delete(c.listeners, l.tunnelID)
	}
	c.mu.Unlock()
	if mux == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var resp wire.Response
	if err := c.call(ctx, mux, wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: l.tunnelID}}, &resp); err != nil {
		c.log().Debug("unbind", "url", l.url, "err", err)
	}
}

// Close unbinds every listener, ends the session and waits for the
// client's goroutines. Listeners' Accept then returns an error wrapping
// net.ErrClosed. It is safe to call more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.wg.Wait()
		return nil
	}
	c.closed = true
	ls := make([]*Listener, 0, len(c.listeners))
	for _, l := range c.listeners {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	for _, l := range ls {
		l.shut()
		c.unbind(l)
	}
	c.mu.Lock()
	mux := c.mux
	c.mu.Unlock()
	if mux != nil {
		mux.Close()
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

// printable keeps a message from the edge to printable ASCII.
func printable(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}
