package edge_test

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// edgeOn runs srv on the given agent and HTTP listeners until cleanup.
func edgeOn(t testing.TB, srv *edge.Server, agents, pub net.Listener) *testEdge {
	t.Helper()
	if srv.HTTPPort == "" {
		// Set before any agent binds: ServeHTTPListener would fill it only
		// once its goroutine runs, and an early bind's URL would lack it.
		_, srv.HTTPPort, _ = net.SplitHostPort(pub.Addr().String())
	}
	te := &testEdge{srv: srv, agentAddr: agents.Addr().String(), httpAddr: pub.Addr().String(), serveDone: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(pub) })
	go func() { wg.Wait(); close(te.serveDone) }()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
	}}
	te.httpClient = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
		<-te.serveDone
	})
	return te
}

// restart stops te's server and runs srv on the same agent and HTTP
// addresses.
func (te *testEdge) restart(t testing.TB, srv *edge.Server) *testEdge {
	t.Helper()
	te.srv.Close()
	<-te.serveDone
	agents, err := net.Listen("tcp", te.agentAddr)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := net.Listen("tcp", te.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	return edgeOn(t, srv, agents, pub)
}

// tokens authenticates "alice-token" as alice and "bob-token" as bob.
func tokens(_ context.Context, token string) (string, error) {
	for _, id := range []string{"alice", "bob"} {
		if subtle.ConstantTimeCompare([]byte(token), []byte(id+"-token")) == 1 {
			return id, nil
		}
	}
	return "", errors.New("unknown token")
}

func TestWrongTokenRefused(t *testing.T) {
	t.Parallel()
	rt := &router.MemoryRouter{}
	te := edgeOn(t, &edge.Server{Domain: "example.test", Router: rt, Authenticate: tokens}, listen(t), listen(t))
	good := &agent.Client{Addrs: []string{te.agentAddr}, Token: "alice-token"}
	defer good.Close()
	l, err := good.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, nameHandler("app"))

	for _, tok := range []string{"", "wrong", "alice-token-x"} {
		bad := &agent.Client{Addrs: []string{te.agentAddr}, Token: tok}
		_, err := bad.Listen(context.Background(), "other")
		bad.Close()
		if !errors.Is(err, agent.ErrUnauthorized) {
			t.Errorf("token %q: %v, want ErrUnauthorized", tok, err)
		}
	}
	if routes, _ := rt.Lookup(context.Background(), "http", "other.example.test"); len(routes) != 0 {
		t.Fatal("a refused agent got a route")
	}
	if resp, body := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 || body != "app /" {
		t.Fatalf("the good agent: %d %q", resp.StatusCode, body)
	}
}

// TestGraceKeepsNameForIdentity cuts alice's session: during the grace
// period bob cannot take her name, and alice, reconnecting, gets it back.
func TestGraceKeepsNameForIdentity(t *testing.T) {
	t.Parallel()
	rt := &router.MemoryRouter{}
	te := edgeOn(t, &edge.Server{Domain: "example.test", Router: rt, Authenticate: tokens, Timeouts: edge.Timeouts{Grace: time.Minute}}, listen(t), listen(t))

	var conn atomic.Pointer[net.Conn]
	gate := make(chan struct{})
	dials := 0
	alice := &agent.Client{Addrs: []string{te.agentAddr}, Token: "alice-token", MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials++; dials > 1 {
				<-gate // reconnect only once bob has tried
			}
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				conn.Store(&c)
			}
			return c, err
		}}
	defer alice.Close()
	l, err := alice.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	url := l.URL()
	go http.Serve(l, nameHandler("alice"))

	(*conn.Load()).Close() // the network drops alice's session
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "app.example.test")
		return len(routes) == 0
	})
	bob := &agent.Client{Addrs: []string{te.agentAddr}, Token: "bob-token"}
	defer bob.Close()
	lost := time.Now()
	if _, err := bob.Listen(context.Background(), "app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("bob took alice's name during the grace period: %v", err)
	} else if until := agent.KeptUntil(err); until.Before(lost) || until.After(lost.Add(time.Minute+time.Second)) {
		// The edge says until when it keeps the name, as a time, not only
		// in words: within the grace of a minute from when alice's session
		// was seen to end (its seconds are whole in the message only).
		t.Fatalf("the refusal says the name is kept until %v, want within a minute of %v (%v)", until, lost, err)
	}
	close(gate)
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "app.example.test")
		return len(routes) == 1
	})
	if l.URL() != url {
		t.Fatalf("alice came back as %q, want %q", l.URL(), url)
	}
	if resp, body := get(t, te, url+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("after reconnect: %d %q", resp.StatusCode, body)
	}
}

// rawConn dials the edge's agent port at addr and exchanges the
// preambles, as a hand-written agent; it returns the conn and the window.
func rawConn(t testing.TB, addr string) (net.Conn, uint32) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.WritePreamble(c, wire.DefaultWindow); err != nil {
		t.Fatal(err)
	}
	window, err := wire.ReadPreamble(c)
	if err != nil {
		t.Fatal(err)
	}
	return c, window
}

// rawWireSession is rawSession as a wire.Session, whose framer answers the
// edge's PING frames (wire.PingFrameVersion).
func rawWireSession(t testing.TB, addr string) *wire.Session {
	t.Helper()
	c, window := rawConn(t, addr)
	s := wire.NewSession(c, window, true, 0)
	t.Cleanup(func() { s.Close() })
	return s
}

// rawSession opens a muxado session to the edge as a hand-written agent.
func rawSession(t testing.TB, addr string) muxado.Session {
	t.Helper()
	c, window := rawConn(t, addr)
	s := muxado.Client(c, wire.MuxConfig(window))
	t.Cleanup(func() { s.Close() })
	return s
}

func TestMalformedControlMessages(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	te.serveApp(t, "app", nameHandler("app"))
	cases := map[string][]byte{
		"huge length":   {byte(wire.StreamControl), 0xff, 0xff, 0xff, 0xff, 'x'},
		"not JSON":      append([]byte{byte(wire.StreamControl), 0, 0, 0, 5}, "{{{{{"...),
		"unknown type":  {0x7f, 1, 2, 3},
		"bind first":    mustMessage(t, wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: "http", Name: "evil"}}),
		"hello no body": mustMessage(t, wire.Request{Op: wire.OpHello}),
	}
	for name, msg := range cases {
		s := rawSession(t, te.agentAddr)
		st, err := s.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		st.Write(msg)
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		// Either an error response or a closed stream; never a grant.
		var resp wire.Response
		if err := wire.ReadMessage(st, &resp); err == nil && resp.Error == nil {
			t.Errorf("%s: accepted: %+v", name, resp)
		}
	}
	// The edge keeps serving the good agent.
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("good agent after hostile ones: %d", resp.StatusCode)
	}
	if resp, _ := get(t, te, te.url("evil")+"/", nil); resp.StatusCode != 404 {
		t.Fatalf("a hostile bind got a route: %d", resp.StatusCode)
	}
}

// rawCall sends req on a stream of its own of the hand-written agent's
// session s, and returns the edge's answer.
func rawCall(t testing.TB, s muxado.Session, req wire.Request) wire.Response {
	t.Helper()
	st, err := s.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Write(mustMessage(t, req))
	st.SetReadDeadline(time.Now().Add(30 * time.Second))
	var resp wire.Response
	if err := wire.ReadMessage(st, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func mustMessage(t testing.TB, req wire.Request) []byte {
	var b strings.Builder
	if err := wire.WriteMessage(&b, []byte{byte(wire.StreamControl)}, req); err != nil {
		t.Fatal(err)
	}
	return []byte(b.String())
}

// TestHostileEdgeProxyHeaders runs a fake edge that sends the agent broken
// proxy headers: the agent drops those streams, and delivers the good one.
func TestHostileEdgeProxyHeaders(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	defer ln.Close()
	edgeDone := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			edgeDone <- err
			return
		}
		window, err := wire.ReadPreamble(c)
		if err == nil {
			err = wire.WritePreamble(c, window)
		}
		if err != nil {
			edgeDone <- err
			return
		}
		s := muxado.Server(c, wire.MuxConfig(window))
		defer s.Close()
		// Serve the agent's streams like an edge: answer its requests and
		// its heartbeat.
		bound := make(chan struct{})
		go answerStreams(s, func(st muxado.Stream, _ wire.StreamType) {
			var req wire.Request
			wire.ReadMessage(st, &req)
			switch req.Op {
			case wire.OpHello:
				wire.WriteMessage(st, nil, wire.Response{HelloResp: &wire.HelloResp{Version: 1, SessionID: "s"}})
			case wire.OpBind:
				wire.WriteMessage(st, nil, wire.Response{BindResp: &wire.BindResp{TunnelID: "t1", URL: "http://app.example.test"}})
				close(bound)
			default:
				wire.WriteMessage(st, nil, wire.Response{})
			}
		})
		<-bound
		good, _ := wire.AppendProxyStream(nil, wire.ProxyHeader{TunnelID: "t1", Proto: "http"})
		unknown, _ := wire.AppendProxyStream(nil, wire.ProxyHeader{TunnelID: "nope", Proto: "http"})
		for _, b := range [][]byte{
			{byte(wire.StreamProxy), 0x00, 0x05, 1, 2, 3, 4, 5},          // fields overrun the body
			{byte(wire.StreamProxy), 0xff, 0xff},                         // long header, then silence
			{byte(wire.StreamProxy), 0x00, 0x03, 0x00, 0x00, 0x09, 0x01}, // bad address
			{0x99},  // unknown type
			unknown, // no such tunnel
			append(good, "good"...),
		} {
			st, err := s.OpenStream()
			if err != nil {
				edgeDone <- err
				return
			}
			st.Write(b)
			defer st.Close()
		}
		edgeDone <- nil
		s.Wait()
	}()
	c := &agent.Client{Addrs: []string{ln.Addr().String()}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "good" {
		t.Fatalf("delivered stream: %q, %v", buf, err)
	}
	if err := <-edgeDone; err != nil {
		t.Fatal(err)
	}
}

// answerStreams accepts the streams the peer of s opens, until s ends: it
// echoes the heartbeat, and hands every other stream, its type read, to
// handle, which runs in a goroutine of its own; the stream is closed after.
func answerStreams(s muxado.Session, handle func(st muxado.Stream, typ wire.StreamType)) {
	for {
		st, err := s.AcceptStream()
		if err != nil {
			return
		}
		go func() {
			defer st.Close()
			var typ [1]byte
			io.ReadFull(st, typ[:])
			if wire.StreamType(typ[0]) == wire.StreamHeartbeat {
				wire.Echo(st)
				return
			}
			handle(st, wire.StreamType(typ[0]))
		}()
	}
}

// TestSilentAndSlowClientsTimedOut: a TLS client that sends nothing and
// an HTTP client that never finishes its header are closed after
// Timeouts.Handshake, while the edge serves others. The bound is 1 s: the
// agent's own handshake and the other client's request must fit in it on
// a busy machine.
func TestSilentAndSlowClientsTimedOut(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{Handshake: time.Second}}
	pubTLS := listen(t)
	te := edgeOn(t, srv, listen(t), listen(t))
	go srv.ServeSNI(pubTLS)
	te.serveApp(t, "app", nameHandler("app"))

	// A TLS client that sends nothing, and a slowloris HTTP client that
	// never finishes its header.
	silent, err := net.Dial("tcp", pubTLS.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	slow, err := net.Dial("tcp", te.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost: app.example.test\r\nX-Slow: a")

	// Meanwhile the edge serves others.
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for name, c := range map[string]net.Conn{"silent TLS client": silent, "slowloris": slow} {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		b, err := io.ReadAll(c)
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			t.Errorf("%s: not closed by the edge", name)
		}
		// The HTTP server may answer 408 before closing.
		if len(b) > 0 && !strings.Contains(string(b), "408") {
			t.Errorf("%s: got %q", name, b)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// tcpRelay forwards between a client and addr until frozen, when it stops
// moving bytes without closing anything: a network that stops delivering.
// Cutting it closes only the client's side of each connection: the far
// side still holds its end, as when an agent's network drops and the edge
// has not noticed yet.
type tcpRelay struct {
	ln     net.Listener
	frozen atomic.Bool
	mu     sync.Mutex
	closed bool
	front  []net.Conn // the clients' sides
	back   []net.Conn // addr's sides
}

func newRelay(t testing.TB, addr string) *tcpRelay {
	r := &tcpRelay{ln: listen(t)}
	go func() {
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			if r.closed {
				// Accepted as the test ended: its copies would outlive it.
				r.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			r.front = append(r.front, c)
			r.back = append(r.back, up)
			r.mu.Unlock()
			go r.copy(up, c)
			go r.copy(c, up)
		}
	}()
	t.Cleanup(func() {
		r.ln.Close()
		r.frozen.Store(false) // copies holding bytes go on, and end
		r.mu.Lock()
		r.closed = true
		for _, c := range append(r.front, r.back...) {
			c.Close()
		}
		r.mu.Unlock()
	})
	return r
}

// cut closes the client's side of every relayed connection.
func (r *tcpRelay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.front {
		c.Close()
	}
}

func (r *tcpRelay) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		for r.frozen.Load() {
			time.Sleep(10 * time.Millisecond) // hold the bytes: frozen
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestFrozenNetworkDetectedByHeartbeat: a link that stops carrying bytes
// either way, but stays open, is found dead by the heartbeats of both
// ends. The timeout is 1 s, so that the session lives until the freeze on
// a busy machine: the agent, whose backoff is an hour, would never come
// back from a session lost before.
func TestFrozenNetworkDetectedByHeartbeat(t *testing.T) {
	t.Parallel()
	const interval, timeout = 100 * time.Millisecond, time.Second
	rt := &router.MemoryRouter{}
	te := edgeOn(t, &edge.Server{Domain: "example.test", Router: rt, Timeouts: edge.Timeouts{HeartbeatInterval: interval, HeartbeatTimeout: timeout}}, listen(t), listen(t))
	r := newRelay(t, te.agentAddr)
	disconnected := make(chan time.Time, 1)
	c := &agent.Client{Addrs: []string{r.ln.Addr().String()}, HeartbeatInterval: interval, HeartbeatTimeout: timeout, MinBackoff: time.Hour,
		OnEvent: func(e agent.Event) {
			if e.Kind == agent.Disconnected {
				select {
				case disconnected <- time.Now():
				default:
				}
			}
		}}
	defer c.Close()
	if _, err := c.Listen(context.Background(), "app"); err != nil {
		t.Fatal(err)
	}
	frozeAt := time.Now()
	r.frozen.Store(true)
	bound := interval + timeout
	// Edge side: the route goes when the edge gives up on the session.
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "app.example.test")
		return len(routes) == 0
	})
	edgeDetect := time.Since(frozeAt)
	select {
	case at := <-disconnected:
		t.Logf("frozen link detected: edge after %v, agent after %v (bound %v + one interval of phase)", edgeDetect.Round(time.Millisecond), at.Sub(frozeAt).Round(time.Millisecond), bound)
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not detect the frozen link")
	}
}

// TestEdgeRestartSameURL restarts the edge on the same addresses: the agent
// comes back with the same URL, and requests succeed without the app doing
// anything.
func TestEdgeRestartSameURL(t *testing.T) {
	t.Parallel()
	agentsLn, pubLn := listen(t), listen(t)
	agentsAddr := agentsLn.Addr().String()
	srv1 := &edge.Server{Domain: "example.test"}
	te := edgeOn(t, srv1, agentsLn, pubLn)
	reconnected := make(chan time.Time, 4)
	c := &agent.Client{Addrs: []string{agentsAddr}, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		OnEvent: func(e agent.Event) {
			if e.Kind == agent.Connected {
				reconnected <- time.Now()
			}
		}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	<-reconnected
	url := l.URL()
	go http.Serve(l, nameHandler("app"))
	if resp, _ := get(t, te, url+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("before restart: %d", resp.StatusCode)
	}

	stopped := time.Now()
	te2 := te.restart(t, &edge.Server{Domain: "example.test"})
	select {
	case at := <-reconnected:
		t.Logf("agent reconnected %v after the edge stopped", at.Sub(stopped).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not reconnect")
	}
	testwait.For(t, func() bool { return l.URL() == url })
	var resp *http.Response
	var body string
	testwait.For(t, func() bool {
		resp, body = get(t, te2, url+"/", nil)
		return resp.StatusCode == 200
	})
	if body != "app /" {
		t.Fatalf("after restart: %q", body)
	}
}

// TestKillAgentMidTransfer cuts an agent's connection during a download:
// the client gets an error promptly, and the edge releases everything.
func TestKillAgentMidTransfer(t *testing.T) {
	te := startEdge(t)
	base := runtime.NumGoroutine()
	var conn atomic.Pointer[net.Conn]
	c := &agent.Client{Addrs: []string{te.agentAddr}, MinBackoff: time.Hour, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			conn.Store(&nc)
		}
		return nc, err
	}}
	l, err := c.Listen(context.Background(), "big")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, pattern(1<<40)) // endless
	}))
	resp, err := te.httpClient.Get(te.url("big") + "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, resp.Body, 8<<20); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	(*conn.Load()).Close()
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("the download ended cleanly after the agent died")
	}
	t.Logf("client saw %v after %v", err, time.Since(killed).Round(time.Millisecond))
	c.Close()
	te.httpClient.Transport.(*http.Transport).CloseIdleConnections()
	testwait.Goroutines(t, base)
}

func TestSessionsPerIdentityAndStreamLimits(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test", Authenticate: identityIsToken, Limits: edge.Limits{SessionsPerIdentity: 2, StreamsPerSession: 4, ClientShare: -1}}
	te := edgeOn(t, srv, listen(t), listen(t))
	var clients []*agent.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	// The agent waits for an edge that answers unavailable: 2 s at most.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i := range 3 {
		c := &agent.Client{Addrs: []string{te.agentAddr}}
		clients = append(clients, c)
		_, err := c.Listen(ctx, fmt.Sprintf("n%d", i))
		if i < 2 && err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		if i == 2 && !errors.Is(err, agent.ErrUnavailable) {
			t.Fatalf("third session of one identity: %v, want refused", err)
		}
	}
	// Streams: the agent holds each connection open; past the bound the
	// edge answers 503 instead of opening more streams.
	release := make(chan struct{})
	var held atomic.Int32 // requests the app holds
	l, err := clients[0].Listen(context.Background(), "busy")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held.Add(1)
		<-release
	}))
	var wg sync.WaitGroup
	var refused atomic.Int32
	codes := make(chan int, 8)
	for range 8 {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
			}}}
			resp, err := c.Get(te.url("busy") + "/")
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				refused.Add(1)
			}
			codes <- resp.StatusCode
		})
	}
	// Every request is either held by the app or refused at once; then the
	// app lets its requests go.
	testwait.For(t, func() bool { return held.Load()+refused.Load() == 8 })
	close(release)
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	// Four streams fit; a ping stream, or a control stream of the agent's
	// last bind, may still be counted for a moment, so three may.
	if got[200] < 3 || got[200] > 4 || got[200]+got[503] != 8 {
		t.Fatalf("status counts %v, want 3 or 4 x200 and the rest 503 agent_busy", got)
	}
}

// TestStreamWindowNegotiated: the edge grants the smaller of its window and
// the agent's, and large transfers work at every combination.
func TestStreamWindowNegotiated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ edge, agent int }{
		{128 << 10, 1 << 20},
		{0, 64 << 10},
		{4 << 20, 0},
	} {
		srv := &edge.Server{Domain: "example.test", Limits: edge.Limits{StreamWindow: c.edge}}
		te := edgeOn(t, srv, listen(t), listen(t))
		a := &agent.Client{Addrs: []string{te.agentAddr}, StreamWindow: c.agent}
		l, err := a.Listen(context.Background(), "app")
		if err != nil {
			t.Fatal(err)
		}
		go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			io.Copy(w, pattern(n))
		}))
		const size = 4 << 20
		resp, err := te.httpClient.Post(te.url("app")+"/", "application/octet-stream", pattern(size))
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			t.Fatalf("windows edge %d agent %d: %d bytes back, %v", c.edge, c.agent, n, err)
		}
		a.Close()
	}
}

func TestBadPreambleRefused(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	te.serveApp(t, "app", nameHandler("app"))
	for _, first := range []string{"GET / HTTP/1.1\r\n\r\n", "TKT1\x00\x00\x00\x01", "TKT9\x00\x04\x00\x00"} {
		c, err := net.Dial("tcp", te.agentAddr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, first)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if len(b) != 0 || isTimeout(err) {
			t.Errorf("%q: got %q, %v; want closed", first, b, err)
		}
	}
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("good agent: %d", resp.StatusCode)
	}
}

// TestSilentAppTimedOut: an app that never answers costs the edge a
// goroutine only until ResponseHeaderTimeout; the client gets 504.
func TestSilentAppTimedOut(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{ResponseHeader: 100 * time.Millisecond}}, listen(t), listen(t))
	release := make(chan struct{})
	defer close(release)
	te.serveApp(t, "silent", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	resp, body := get(t, te, te.url("silent")+"/", nil)
	if resp.StatusCode != 504 || resp.Header.Get("Tunnelkit-Error") != "app_timeout" {
		t.Fatalf("silent app: %d %q, want 504 app_timeout", resp.StatusCode, body)
	}
}
