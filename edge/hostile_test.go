package edge_test

// No client can crash the edge, eat its memory or starve a tunnel: each
// test here is a row of the table of issue #10, tried as an attacker would.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"golang.ngrok.com/muxado/v2"
)

// helloMessage is a hello request as a control stream's first bytes.
func helloMessage(t testing.TB, token string) []byte {
	return mustMessage(t, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: token}})
}

// TestConcurrentHellosNeverPanic: sessions each send two hellos on two
// control streams at once. The edge decides one hello per session and
// never panics (a panic would end this test binary).
func TestConcurrentHellosNeverPanic(t *testing.T) {
	t.Parallel()
	// A slow Authenticate widens the window between two hellos' checks.
	slowTokens := func(ctx context.Context, token string) (string, error) {
		time.Sleep(2 * time.Millisecond)
		return tokens(ctx, token)
	}
	for auth, authenticate := range map[string]func(context.Context, string) (string, error){"none": nil, "tokens": tokens, "slow": slowTokens} {
		srv := &edge.Server{Domain: "example.test", Authenticate: authenticate}
		token := ""
		if authenticate != nil {
			token = "alice-token"
		}
		te := edgeOn(t, srv, listen(t), listen(t))
		for range 150 {
			s := rawSession(t, te.agentAddr)
			var wg sync.WaitGroup
			granted := atomic.Int32{}
			for range 2 {
				wg.Go(func() {
					st, err := s.OpenStream()
					if err != nil {
						return
					}
					defer st.Close()
					st.Write(helloMessage(t, token))
					st.SetReadDeadline(time.Now().Add(10 * time.Second))
					var resp wire.Response
					if wire.ReadMessage(st, &resp) == nil && resp.HelloResp != nil {
						granted.Add(1)
					}
				})
			}
			wg.Wait()
			s.Close()
			if granted.Load() > 1 {
				t.Fatalf("auth %s: both hellos of one session were accepted", auth)
			}
		}
		c := &agent.Client{Addrs: []string{te.agentAddr}, Token: token}
		l, err := c.Listen(context.Background(), "app")
		if err != nil {
			t.Fatalf("auth %s: a real agent after the hellos: %v", auth, err)
		}
		serve(t, l, "app")
		if resp, body := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
			t.Fatalf("auth %s: %d %q", auth, resp.StatusCode, body)
		}
		c.Close()
	}
}

// TestStreamsBeforeHelloRefused: before any hello, sessions open thousands
// of streams, each announcing a 64 KiB control message and sending 6 bytes.
// The edge closes each such session at its second stream, allocates nothing
// for the announced bytes, and a real agent connects meanwhile.
func TestStreamsBeforeHelloRefused(t *testing.T) {
	te := edgeOn(t, &edge.Server{Domain: "example.test"}, listen(t), listen(t))
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	var opened atomic.Int64
	closed := make(chan struct{}, 32)
	for range 32 {
		wg.Go(func() {
			s := rawSession(t, te.agentAddr)
			announce := []byte{byte(wire.StreamControl), 0, 1, 0, 0, '{'} // 64 KiB to come
			for range 4096 {
				st, err := s.OpenStream()
				if err != nil {
					break
				}
				if _, err := st.Write(announce); err != nil {
					break
				}
				opened.Add(1)
			}
			s.Wait() // returns once the edge closed the session
			closed <- struct{}{}
		})
	}
	// A real agent gets through while the attack runs.
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	serve(t, l, "app")
	wg.Wait()
	if len(closed) != 32 {
		t.Fatalf("%d of 32 attacking sessions closed by the edge", len(closed))
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("%d streams opened before the edge closed the sessions; heap in use grew %d KiB", opened.Load(), grew>>10)
	if grew > 64<<20 {
		t.Fatalf("heap grew %d MiB after the attack ended", grew>>20)
	}
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("the real agent: %d", resp.StatusCode)
	}
}

// TestPendingSessionsBounded: silent connections on the agent port past
// MaxPendingSessions push out the oldest; a real agent still connects.
func TestPendingSessionsBounded(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Limits: edge.Limits{PendingSessions: 50}}, listen(t), listen(t))
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range 120 {
		c, err := net.Dial("tcp", te.agentAddr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	// 70 are closed to make room, once the edge has taken all 120 (in
	// the order its goroutines get to them). Before that, a real agent's
	// connection could be among the oldest pending.
	closed := make([]bool, len(silent))
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; n < 70; {
		if time.Now().After(deadline) {
			t.Fatalf("%d silent connections closed past the bound of 50, want 70", n)
		}
		for i, c := range silent {
			if closed[i] {
				continue
			}
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
				closed[i] = true
				n++
			}
		}
	}
	a := &agent.Client{Addrs: []string{te.agentAddr}}
	defer a.Close()
	if _, err := a.Listen(context.Background(), "app"); err != nil {
		t.Fatalf("a real agent beside 120 silent connections: %v", err)
	}
}

// TestNoKeepAliveFloodKeepsTunnelUp: 600 requests, each on its own client
// connection, 50 at a time, through an agent that forwards to an app. None
// fails, and afterwards the agent holds no connection to the app (no
// stream outlives its request).
func TestNoKeepAliveFloodKeepsTunnelUp(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	var open atomic.Int32
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	app.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	app.Start()
	defer app.Close()
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	go forward.Bytes{To: app.Listener.Addr().String()}.Serve(l)
	n := 600
	if testing.Short() {
		n = 300
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
		}}}
	var failed atomic.Int32
	var wg sync.WaitGroup
	work := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			for range work {
				resp, err := client.Get(te.url("app") + "/")
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
				}
			}
		})
	}
	for range n {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), n)
	}
	testwait.For(t, func() bool { return open.Load() == 0 })
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("after the flood: %d", resp.StatusCode)
	}
}

// proxiedEdge runs an edge behind a "load balancer": every public
// connection starts with a PROXY header naming its client, so tests can
// play clients at many addresses while dialling from loopback (127.0.0.1,
// unless srv.ProxyProtocolFrom says otherwise).
type proxiedEdge struct {
	*testEdge
	tlsAddr string
}

func startProxiedEdge(t testing.TB, srv *edge.Server) *proxiedEdge {
	t.Helper()
	if srv.ProxyProtocolFrom == nil {
		srv.ProxyProtocolFrom = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")} // the tests' address
	}
	te := edgeOn(t, srv, listen(t), listen(t))
	tlsLn := listen(t)
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeSNI(tlsLn) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return &proxiedEdge{testEdge: te, tlsAddr: tlsLn.Addr().String()}
}

// dialAs connects to addr as the client from, with a PROXY v1 header.
func dialAs(ctx context.Context, addr, from string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := proxyproto.Write(c, 1, netip.MustParseAddrPort(from), netip.MustParseAddrPort("192.0.2.1:443")); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// clientAs is an HTTP client of the edge at the address from.
func (e *proxiedEdge) clientAs(from string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dialAs(ctx, e.httpAddr, from) },
	}}
}

// TestSlowBodiesCutAndOthersServed: an attacker starts many requests whose
// bodies trickle in, then stop. Past its share it is refused (429); the
// bodies that stop are cut off (408); another client is served throughout.
func TestSlowBodiesCutAndOthersServed(t *testing.T) {
	t.Parallel()
	// The body timeout outlasts the time 100 connections take to arrive
	// on a loaded machine: a slow request cut off before the last ones
	// arrived would free its place in the share for one more.
	e := startProxiedEdge(t, &edge.Server{Domain: "example.test", Limits: edge.Limits{StreamsPerSession: 64, ClientShare: 0.25}, Timeouts: edge.Timeouts{Body: 3 * time.Second}})
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // the whole body, then the answer
	}))
	statuses := make(chan int, 100)
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			conn, err := dialAs(context.Background(), e.httpAddr, "198.51.100.66:1000")
			if err != nil {
				statuses <- -1
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: app.example.test\r\nContent-Length: 1000\r\n\r\nslow")
			conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				statuses <- 0
				return
			}
			statuses <- resp.StatusCode
		})
	}
	// A slow body for a name that has no tunnel is answered at once.
	conn, err := dialAs(context.Background(), e.httpAddr, "198.51.100.67:1000")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: nope.example.test\r\nContent-Length: 1000\r\n\r\nslow")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || resp.StatusCode != 404 {
		t.Fatalf("slow body to an unknown name: %v %v, want 404 at once", resp, err)
	}
	conn.Close()
	good := e.clientAs("203.0.113.5:2000")
	for i := range 20 {
		resp, err := good.Post(e.url("app")+"/", "text/plain", strings.NewReader("a whole body"))
		if err != nil {
			t.Fatalf("good request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("good request %d: %d", i, resp.StatusCode)
		}
	}
	wg.Wait()
	close(statuses)
	got := map[int]int{}
	for s := range statuses {
		got[s]++
	}
	// ClientShare 0.25 of 64 streams: 16 slow requests at most get through
	// to the app and are cut off; the others are refused at once.
	if got[408] == 0 || got[408] > 16 || got[408]+got[429] != 100 {
		t.Fatalf("slow requests ended with %v, want at most 16 x408 and the rest 429", got)
	}
}

// TestIdleConnsHoldOnlyTheirShare: one client opens many idle connections
// to a TCP endpoint and a TLS endpoint; past its share they are closed, and
// another client is served.
func TestIdleConnsHoldOnlyTheirShare(t *testing.T) {
	t.Parallel()
	e := startProxiedEdge(t, &edge.Server{Domain: "example.test", TCPPorts: edge.PortRange{Min: 1024, Max: 65535}, Limits: edge.Limits{StreamsPerSession: 64, ClientShare: 0.25}})
	pki := testpki.New(t)
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	defer c.Close()
	tcpL := bind(t, c, "tcp://")
	go forward.Bytes{To: startEchoUpstream(t)}.Serve(tcpL)
	tlsL := bind(t, c, "tls://app.example.test")
	tlsApp := &http.Server{Handler: nameHandler("tls"), ErrorLog: log.New(io.Discard, "", 0)}
	go tlsApp.Serve(tls.NewListener(tlsL, &tls.Config{Certificates: []tls.Certificate{pki.Issue(t, "app.example.test")}}))
	tcpAddr := tcpAddrOf(t, tcpL.URL())
	hello := clientHelloFor(t, "app.example.test")

	for _, ep := range []struct {
		name, addr string
		first      []byte
	}{{"tcp", tcpAddr, nil}, {"tls", e.tlsAddr, hello}} {
		var idle []net.Conn
		for range 60 {
			conn, err := dialAs(context.Background(), ep.addr, "198.51.100.66:1000")
			if err != nil {
				t.Fatal(err)
			}
			conn.Write(ep.first)
			idle = append(idle, conn)
		}
		// Those past the share are closed by the edge.
		var closedByEdge atomic.Int32
		var wg sync.WaitGroup
		for _, conn := range idle {
			conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			wg.Go(func() {
				if _, err := conn.Read(make([]byte, 1)); err == io.EOF {
					closedByEdge.Add(1)
				}
			})
		}
		wg.Wait()
		for _, conn := range idle {
			conn.Close()
		}
		if closedByEdge.Load() < 60-16 {
			t.Errorf("%s: %d of 60 idle connections closed, want at least %d (past the share of 16)", ep.name, closedByEdge.Load(), 60-16)
		}
	}
	// Meanwhile, and after, another client is served.
	conn, err := dialAs(context.Background(), tcpAddr, "203.0.113.5:2000")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "echo")
	conn.(*net.TCPConn).CloseWrite()
	if b, _ := io.ReadAll(conn); string(b) != "echo" {
		t.Fatalf("tcp for another client: %q", b)
	}
	conn.Close()
	tc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialAs(ctx, e.tlsAddr, "203.0.113.5:2001")
		},
		TLSClientConfig: &tls.Config{RootCAs: pki.Pool},
	}}
	resp, err := tc.Get("https://app.example.test/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "tls /" {
		t.Fatalf("tls for another client: %q", b)
	}
}

// clientHelloFor returns the first flight of a TLS client asking for name.
func clientHelloFor(t testing.TB, name string) []byte {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: name}).Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 16<<10)
	n, err := b.Read(buf)
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestWrongTokensThrottled: one source keeps trying wrong tokens. Past
// MaxAuthFailures its connections are closed as they are accepted; the
// first failures are logged one by one, the rest in aggregate; an agent
// from another address is served.
func TestWrongTokensThrottled(t *testing.T) {
	t.Parallel()
	var lines atomic.Int32
	srv := &edge.Server{Domain: "example.test", Authenticate: tokens, Logger: slogAll(&lines), Limits: edge.Limits{AuthFailures: 5}}
	te := edgeOn(t, srv, listen(t), listen(t))
	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	go srv.ServeAgents(ln6)
	unauthorized, cut := 0, 0
	start := time.Now()
	for range 100 {
		// A raw hello, tried once: an agent would take a connection cut
		// at accept for an edge that restarts, and wait for it.
		switch hello := wrongTokenHello(t, te.agentAddr); hello {
		case wire.CodeUnauthorized:
			unauthorized++
		case "cut":
			cut++
		default:
			t.Fatalf("a wrong token: %s", hello)
		}
	}
	// A burst of 5, and one more try each 12 s (5 a minute).
	allowed := 5 + int(time.Since(start)/(12*time.Second)) + 1
	if unauthorized > allowed || unauthorized+cut != 100 {
		t.Fatalf("%d refused with a reason, %d cut at accept; want at most %d (the burst of 5 and its refills) and the rest cut", unauthorized, cut, allowed)
	}
	good := &agent.Client{Addrs: []string{ln6.Addr().String()}, Token: "alice-token"}
	defer good.Close()
	if _, err := good.Listen(context.Background(), "app"); err != nil {
		t.Fatalf("an agent at another address: %v", err)
	}
	srv.Close()
	if n := lines.Load(); n > 20 {
		t.Fatalf("%d log lines for 100 failed hellos, want them in aggregate", n)
	}
}

// wrongTokenHello opens a session to addr and says hello with a wrong
// token, once: it returns the error code of the answer, "cut" when the
// edge closed the connection before answering, or what else came.
func wrongTokenHello(t *testing.T, addr string) string {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := wire.WritePreamble(c, wire.DefaultWindow); err != nil {
		return "cut"
	}
	window, err := wire.ReadPreamble(c)
	if err != nil {
		return "cut"
	}
	s := muxado.Client(c, wire.MuxConfig(window))
	defer s.Close()
	st, err := s.OpenStream()
	if err != nil {
		return "cut"
	}
	st.Write(helloMessage(t, "wrong"))
	var resp wire.Response
	if err := wire.ReadMessage(st, &resp); err != nil {
		return "cut"
	}
	if resp.Error == nil {
		return "accepted"
	}
	return resp.Error.Code
}

// slogAll counts every record at Info or above.
func slogAll(n *atomic.Int32) *slog.Logger { return slog.New(levelCounter{n}) }

type levelCounter struct{ n *atomic.Int32 }

func (h levelCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h levelCounter) Handle(context.Context, slog.Record) error    { h.n.Add(1); return nil }
func (h levelCounter) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h levelCounter) WithGroup(string) slog.Handler                { return h }

// rawHTTP sends raw bytes to the edge's HTTP port, half-closes, and reads
// one response.
func rawHTTP(t testing.TB, addr, req string) (*http.Response, string) {
	t.Helper()
	return rawHTTPThen(t, addr, req, nil)
}

// rawHTTPThen is rawHTTP, calling halfClosed (when not nil) once it
// half-closed.
func rawHTTPThen(t testing.TB, addr, req string, halfClosed func()) (*http.Response, string) {
	t.Helper()
	return rawHTTPRequest(t, addr, req, true, halfClosed)
}

// rawHTTPOpen is rawHTTP with the client's side kept open until the
// answer came: the edge holds a half-closed client's exchange only while
// its answer moves (it ends after 1 s of silence), and a silent app's 504
// may come later.
func rawHTTPOpen(t testing.TB, addr, req string) (*http.Response, string) {
	t.Helper()
	return rawHTTPRequest(t, addr, req, false, nil)
}

// rawHTTPRequest sends req, half-closes if halfClose says so and calls
// halfClosed, and reads one response.
func rawHTTPRequest(t testing.TB, addr, req string, halfClose bool, halfClosed func()) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, req)
	if halfClose {
		conn.(*net.TCPConn).CloseWrite()
	}
	if halfClosed != nil {
		halfClosed()
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response to %q: %v", req, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestHalfCloseGetsTheAppsResponse: a client sends its request and
// half-closes its side; the request reaches the app and the app's own
// response comes back.
func TestHalfCloseGetsTheAppsResponse(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	var posts atomic.Int32
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	halfClosed := make(chan struct{}, 1)
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == "POST" {
			posts.Add(1)
		}
		<-halfClosed // answer after the client half-closed
		w.WriteHeader(201)
		fmt.Fprintf(w, "%s %s", r.Method, body)
	}))
	signal := func() { halfClosed <- struct{}{} }
	resp, body := rawHTTPThen(t, te.httpAddr, "GET / HTTP/1.1\r\nHost: app.example.test\r\n\r\n", signal)
	if resp.StatusCode != 201 || body != "GET " {
		t.Fatalf("GET then half-close: %d %q, want the app's 201", resp.StatusCode, body)
	}
	resp, body = rawHTTPThen(t, te.httpAddr, "POST / HTTP/1.1\r\nHost: app.example.test\r\nContent-Length: 5\r\n\r\nhello", signal)
	if resp.StatusCode != 201 || body != "POST hello" || posts.Load() != 1 {
		t.Fatalf("POST then half-close: %d %q (%d posts), want the app's 201", resp.StatusCode, body, posts.Load())
	}
}

// TestEdgeErrorsSayWhy: each failure the edge answers itself has its own
// status and a stable code. The app's answer is waited for 2 s, which the
// silent app's 504 takes: the refusal of an app that is down, and the end
// of one that crashed, come back through the agent within it on a busy
// machine. The client keeps its side open, as a half-closed one's
// exchange ends after 1 s of silence.
func TestEdgeErrorsSayWhy(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{ResponseHeader: 2 * time.Second}}, listen(t), listen(t))
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	// An app that is not running: the agent's dial is refused.
	down := bind(t, c, "down")
	go forward.Bytes{To: deadAddr(t)}.Serve(down)
	up := bind(t, c, "up")
	serve(t, up, "up")
	slow := bind(t, c, "slow")
	release := make(chan struct{})
	defer close(release)
	go http.Serve(slow, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	crash := bind(t, c, "crash")
	go func() {
		for {
			conn, err := crash.Accept()
			if err != nil {
				return
			}
			conn.Read(make([]byte, 1))
			conn.Close() // no response at all
		}
	}()
	for _, tc := range []struct {
		req    string
		status int
		code   string
	}{
		{"GET / HTTP/1.1\r\nHost: nope.example.test\r\n\r\n", 404, "no_endpoint"},
		{"GET / HTTP/1.1\r\nHost: down.example.test\r\n\r\n", 502, "app_unreachable"},
		{"GET / HTTP/1.1\r\nHost: slow.example.test\r\n\r\n", 504, "app_timeout"},
		{"GET / HTTP/1.1\r\nHost: crash.example.test\r\n\r\n", 502, "app_error"},
		{"GET / HTTP/1.0\r\n\r\n", 400, "missing_host"},
		{"GET / HTTP/1.1\r\nHost: a..example.test\r\n\r\n", 400, "bad_request"},
		{"POST / HTTP/1.1\r\nHost: up.example.test\r\nTransfer-Encoding: chunked\r\n\r\n5 ;\"\r\nhello\r\n0\r\n\r\n", 400, "bad_request"},
		{"POST / HTTP/1.1\r\nHost: up.example.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400, "bad_request"},
	} {
		resp, body := rawHTTPOpen(t, te.httpAddr, tc.req)
		if resp.StatusCode != tc.status || resp.Header.Get("Tunnelkit-Error") != tc.code || !strings.HasPrefix(body, tc.code+": ") {
			t.Errorf("%q: %d %s %q, want %d %s", tc.req, resp.StatusCode, resp.Header.Get("Tunnelkit-Error"), body, tc.status, tc.code)
		}
	}
	// The agent is gone: its session ended.
	c.Close()
	resp, _ := rawHTTP(t, te.httpAddr, "GET / HTTP/1.1\r\nHost: up.example.test\r\n\r\n")
	if resp.StatusCode != 404 {
		t.Errorf("after the agent left: %d, want 404", resp.StatusCode)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestUpgradedConnIdleTimeout: an upgraded connection in which nobody says
// anything is closed after IdleTimeout, like any other public connection.
func TestUpgradedConnIdleTimeout(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{HTTPIdle: 200 * time.Millisecond}}, listen(t), listen(t))
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "ws")
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
		brw.Flush()
		io.Copy(io.Discard, conn) // silent until the edge closes
	}))
	conn, err := net.Dial("tcp", te.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: ws.example.test\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); isTimeout(err) {
		t.Fatal("the idle upgraded connection was still open after 10 s (IdleTimeout 200 ms)")
	}
}

// TestEndpointsPerSessionBounded: a session holds at most
// MaxEndpointsPerSession endpoints.
func TestEndpointsPerSessionBounded(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Limits: edge.Limits{EndpointsPerSession: 20}}, listen(t), listen(t))
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	for i := range 20 {
		if _, err := c.Listen(context.Background(), fmt.Sprintf("n%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The agent waits for an edge that answers unavailable: 2 s at most.
	wait, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Listen(wait, "one-too-many"); !errors.Is(err, agent.ErrUnavailable) {
		t.Fatalf("bind past the bound: %v, want ErrUnavailable", err)
	}
}

// TestStreamClosedByAppIsNotReused: the app behind the agent closes idle
// keep-alive connections quickly (as Node.js does after 5 s); a client's
// next request on its own keep-alive connection still gets through, GET and
// POST alike.
func TestStreamClosedByAppIsNotReused(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	te := edgeOn(t, &edge.Server{Domain: "example.test", Observer: obs}, listen(t), listen(t))
	var conns, closed atomic.Int32
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s", r.Method, b)
	}))
	app.Config.IdleTimeout = 20 * time.Millisecond
	app.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	app.Start()
	defer app.Close()
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	go forward.Bytes{To: app.Listener.Addr().String()}.Serve(l)
	// Each request comes once the app closed its idle connection, and the
	// close crossed the agent and reached the edge, which closed the
	// stream: a request sent while the close is on its way meets it,
	// through any proxy.
	afterClose := func() {
		testwait.For(t, func() bool { return closed.Load() == conns.Load() })
		testwait.For(t, func() bool { return obs.get("streams") == 0 })
	}
	for i := range 6 {
		if i > 0 {
			afterClose()
		}
		resp, body := get(t, te, te.url("app")+"/", nil)
		if resp.StatusCode != 200 || body != "GET " {
			t.Fatalf("GET %d after the app closed its idle connection: %d %q", i, resp.StatusCode, body)
		}
		afterClose()
		pr, err := te.httpClient.Post(te.url("app")+"/", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(pr.Body)
		pr.Body.Close()
		if pr.StatusCode != 200 || string(b) != "POST x" {
			t.Fatalf("POST %d: %d %q", i, pr.StatusCode, b)
		}
	}
	if conns.Load() < 12 {
		t.Fatalf("the app saw %d connections; its idle timeout did not close them as the test meant", conns.Load())
	}
}

// TestIdleStreamsYieldToLiveRequests: keep-alive clients leave their
// streams idle until the session's stream bound is reached; a new client's
// request takes an idle stream's place rather than fail.
func TestIdleStreamsYieldToLiveRequests(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Limits: edge.Limits{StreamsPerSession: 8, ClientShare: -1}}, listen(t), listen(t))
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	serve(t, l, "app")
	for i := range 30 {
		// A client of its own each time, whose connection stays open.
		tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
		}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(te.url("app") + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("client %d with %d idle ones before it: %d %q", i, i, resp.StatusCode, b)
		}
	}
}
