package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// testEdge is an edge on loopback with its agent and HTTP listeners.
type testEdge struct {
	srv        *edge.Server
	agentAddr  string
	httpAddr   string
	serveDone  chan struct{}
	httpClient *http.Client
}

func startEdge(t testing.TB) *testEdge {
	t.Helper()
	agents := listen(t)
	pub := listen(t)
	_, port, _ := net.SplitHostPort(pub.Addr().String())
	srv := &edge.Server{Domain: "example.test", HTTPPort: port} // set before any bind, not when ServeHTTPListener's goroutine runs
	te := &testEdge{srv: srv, agentAddr: agents.Addr().String(), httpAddr: pub.Addr().String(), serveDone: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(pub) })
	go func() { wg.Wait(); close(te.serveDone) }()
	tr := &http.Transport{
		// Every name resolves to the edge, as a wildcard DNS record would.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
		},
		MaxIdleConnsPerHost: 64,
	}
	te.httpClient = &http.Client{Transport: tr, Timeout: 60 * time.Second}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
		<-te.serveDone
	})
	return te
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// url returns the public URL of name on the edge.
func (te *testEdge) url(name string) string {
	_, port, _ := net.SplitHostPort(te.httpAddr)
	return "http://" + name + ".example.test:" + port
}

// serveApp binds name on the edge with a new agent client and serves h on
// the listener; it returns the listener and a func that kills the agent.
func (te *testEdge) serveApp(t testing.TB, name string, h http.Handler) (*agent.Listener, *agent.Client) {
	t.Helper()
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	l, err := c.Listen(context.Background(), "http://"+name)
	if err != nil {
		t.Fatal(err)
	}
	if want := te.url(name); l.URL() != want {
		t.Fatalf("URL = %q, want %q", l.URL(), want)
	}
	done := make(chan struct{})
	go func() { defer close(done); http.Serve(l, h) }()
	t.Cleanup(func() { c.Close(); <-done })
	return l, c
}

func get(t testing.TB, te *testEdge, url string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := te.httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("GET %s: body: %v", url, err)
	}
	return resp, string(body)
}

func nameHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	})
}

func TestTwoAgentsEachByName(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	te.serveApp(t, "alpha", nameHandler("alpha"))
	te.serveApp(t, "beta", nameHandler("beta"))
	for _, name := range []string{"alpha", "beta", "ALPHA"} {
		resp, body := get(t, te, te.url(name)+"/x", nil)
		if want := strings.ToLower(name) + " /x"; resp.StatusCode != 200 || body != want {
			t.Fatalf("%s: %d %q, want 200 %q", name, resp.StatusCode, body, want)
		}
	}
}

func TestForwardingHeadersAndRemoteAddr(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	type seen struct {
		remote string
		host   string
		hdr    http.Header
	}
	got := make(chan seen, 1)
	te.serveApp(t, "app", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.RemoteAddr, r.Host, r.Header.Clone()}
	}))
	var clientAddr string
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { clientAddr = info.Conn.LocalAddr().String() }}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", te.url("app")+"/", nil)
	req.Header.Set("X-Forwarded-For", "198.51.100.10")
	req.Header.Set("X-Forwarded-Proto", "https")
	resp, err := te.httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := <-got
	if s.remote != clientAddr {
		t.Errorf("app's RemoteAddr = %q, want the client's %q", s.remote, clientAddr)
	}
	host := strings.TrimPrefix(te.url("app"), "http://")
	if s.host != host {
		t.Errorf("Host = %q, want %q kept", s.host, host)
	}
	checks := map[string]string{
		"X-Forwarded-For":   "198.51.100.10, 127.0.0.1",
		"X-Forwarded-Proto": "https, http",
		"X-Forwarded-Host":  host,
	}
	for k, want := range checks {
		if v := s.hdr.Values(k); len(v) != 1 || v[0] != want {
			t.Errorf("%s = %q, want %q", k, v, want)
		}
	}
}

func TestUnknownNameAndBadHosts(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	te.serveApp(t, "app", nameHandler("app"))
	cases := []struct {
		host string
		code int
	}{
		{"nope.example.test", 404},
		{"example.test", 404},
		{"app.example.org", 404},
		{"[::1]:80", 404},
		{"127.0.0.1", 404},
		{"bad_.-host..example.test", 400},
		{"app.example.test:x", 400},
		{"app.example.test.", 200},
		{"App.Example.Test:1234", 200},
	}
	for _, c := range cases {
		conn, err := net.Dial("tcp", te.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", c.host)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != c.code {
			t.Errorf("Host %q: %d %q, want %d", c.host, resp.StatusCode, body, c.code)
		}
		if c.code != 200 && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Errorf("Host %q: error body is %q", c.host, resp.Header.Get("Content-Type"))
		}
	}
}

func TestAgentKilledFailsCleanly(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	_, c := te.serveApp(t, "app", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}))
	defer close(release)
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("before kill: %d", resp.StatusCode)
	}
	// A request in flight when the agent dies fails, without hanging.
	errc := make(chan error, 1)
	go func() {
		resp, err := te.httpClient.Get(te.url("app") + "/slow")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == 200 {
				err = errors.New("in-flight request succeeded after the agent died")
			}
		}
		errc <- err
	}()
	<-entered
	c.Close()
	if err := <-errc; err != nil && strings.Contains(err.Error(), "succeeded") {
		t.Fatal(err)
	}
	// New requests get 404 (routes went with the session) or 502.
	resp, body := get(t, te, te.url("app")+"/", nil)
	if resp.StatusCode != 404 && resp.StatusCode != 502 {
		t.Fatalf("after kill: %d %q", resp.StatusCode, body)
	}
}

func TestConcurrentRequestsOneSession(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	te.serveApp(t, "app", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Query().Get("i"))
	}))
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range 200 {
		wg.Go(func() {
			resp, err := te.httpClient.Get(fmt.Sprintf("%s/?i=%d", te.url("app"), i))
			if err != nil {
				t.Error(err)
				failed.Add(1)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != fmt.Sprint(i) {
				t.Errorf("request %d got %q", i, body)
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of 200 failed", failed.Load())
	}
}

// pattern is a reader of n deterministic bytes.
func pattern(n int64) io.Reader {
	return io.LimitReader(&patternReader{}, n)
}

type patternReader struct{ i uint64 }

func (p *patternReader) Read(b []byte) (int, error) {
	for j := range b {
		b[j] = byte(p.i*7 + p.i>>11)
		p.i++
	}
	return len(b), nil
}

// TestLargeUploadDownload: 48 MiB up through the tunnel (chunked) and 48
// MiB down arrive whole, and the process's live heap grows by less than
// 32 MiB meanwhile: more than the bound, a body kept whole anywhere on the
// way would show. A scale test, which one goroutine drives: it runs
// without the race detector (.ci/run runs it so), whose cost it would
// multiply for nothing the other tests of the data path do not see.
func TestLargeUploadDownload(t *testing.T) {
	if testing.Short() {
		t.Skip("48 MiB transfers")
	}
	if testtools.RaceEnabled {
		t.Skip("a scale test: .ci/run runs it without the race detector")
	}
	const size = 48 << 20
	te := startEdge(t)
	te.serveApp(t, "app", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case "PUT":
			h := sha256.New()
			n, err := io.Copy(h, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
		case "GET":
			io.Copy(w, pattern(size))
		}
	}))
	want := sha256.New()
	io.Copy(want, pattern(size))
	wantSum := fmt.Sprintf("%x", want.Sum(nil))

	// The live heap, as the last garbage collection marked it: unlike the
	// heap in use, it does not count spans that garbage (of this test's
	// buffers, or earlier tests') left half used.
	live := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	runtime.GC()
	base := live()
	go func() {
		defer close(sampled)
		for {
			if l := live(); l > peak.Load() {
				peak.Store(l)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	req, _ := http.NewRequest("PUT", te.url("app")+"/up", pattern(size))
	req.ContentLength = -1 // chunked: the edge must stream it
	resp, err := te.httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := string(body); got != fmt.Sprintf("%d %s", size, wantSum) {
		t.Fatalf("upload: app saw %q", got)
	}

	resp, err = te.httpClient.Get(te.url("app") + "/down")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil || n != size || fmt.Sprintf("%x", h.Sum(nil)) != wantSum {
		t.Fatalf("download: %d bytes, err %v, match %v", n, err, fmt.Sprintf("%x", h.Sum(nil)) == wantSum)
	}
	close(stop)
	<-sampled
	// Edge, agent, app and client share this heap; 48 MiB went each way.
	// Streaming keeps the growth to buffers and windows.
	growth := int64(peak.Load()) - int64(base)
	t.Logf("live heap: base %d MiB, peak %d MiB", base>>20, peak.Load()>>20)
	if growth > 32<<20 {
		t.Fatalf("heap grew by %d MiB while streaming %d MiB: something buffers whole bodies", growth>>20, size>>20)
	}
}

func TestWebSocketEcho(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	te.serveApp(t, "ws", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	_, port, _ := net.SplitHostPort(te.httpAddr)
	cfg, err := websocket.NewConfig("ws://ws.example.test:"+port+"/echo", "http://ws.example.test/")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", te.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for i := range 5 {
		msg := fmt.Sprintf("message %d %s", i, strings.Repeat("x", i*1000))
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil {
			t.Fatal(err)
		}
		if got != msg {
			t.Fatalf("echo %d: got %d bytes, want %d", i, len(got), len(msg))
		}
	}
}

func TestServerSentEventsStream(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	acks := make(chan struct{})
	te.serveApp(t, "sse", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			w.(http.Flusher).Flush()
			// The next event is sent only after the client has seen this
			// one: a proxy that buffers would deadlock here.
			select {
			case <-acks:
			case <-r.Context().Done():
				return
			}
		}
	}))
	resp, err := te.httpClient.Get(te.url("sse") + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("data: event %d\n", i); line != want {
			t.Fatalf("got %q, want %q", line, want)
		}
		br.ReadString('\n')
		acks <- struct{}{}
	}
}

func TestRandomNameAndNameTaken(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(l.URL(), "http://") || !strings.Contains(l.URL(), ".example.test:") {
		t.Fatalf("random URL = %q", l.URL())
	}
	te.serveApp(t, "taken", nameHandler("taken"))
	other := &agent.Client{Addrs: []string{te.agentAddr}}
	defer other.Close()
	if _, err := other.Listen(context.Background(), "http://taken.example.test"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("second bind of a held name: %v, want ErrNameTaken", err)
	}
	for _, bad := range []string{"http://-bad", "http://a_b", "tcp://x", "http://" + strings.Repeat("a", 64)} {
		if _, err := other.Listen(context.Background(), bad); err == nil {
			t.Errorf("Listen(%q) succeeded", bad)
		}
	}
}

// TestManyBindsAtOnce binds 100 names at once on one agent session: far
// more control streams than the edge's accept backlog (acceptBacklog), all
// served, none reset.
func TestManyBindsAtOnce(t *testing.T) {
	te := startEdge(t)
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Listen(ctx, "http://first"); err != nil { // the session the others share
		t.Fatal(err)
	}
	const n = 100
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := c.Listen(ctx, fmt.Sprintf("http://many%d", i))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestListenerCloseUnbinds(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	l, _ := te.serveApp(t, "app", nameHandler("app"))
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if resp, _ := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 404 {
		t.Fatalf("after unbind: status %d, want 404", resp.StatusCode)
	}
}

func TestShutdownLetsInFlightFinish(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	te.serveApp(t, "app", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "finished")
	}))
	type result struct {
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := te.httpClient.Get(te.url("app") + "/")
		if err != nil {
			res <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{string(b), err}
	}()
	<-entered
	shut := make(chan error, 1)
	go func() { shut <- te.srv.Shutdown(context.Background()) }()
	// New connections are refused once Shutdown has closed the listener.
	testwait.For(t, func() bool {
		c, err := net.Dial("tcp", te.httpAddr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(release)
	r := <-res
	if r.err != nil || r.body != "finished" {
		t.Fatalf("in-flight request: %q, %v", r.body, r.err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestCloseAndShutdownLeaveNoGoroutine(t *testing.T) {
	for _, how := range []string{"Close", "Shutdown"} {
		t.Run(how, func(t *testing.T) {
			base := runtime.NumGoroutine()
			func() {
				srv := &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{HeartbeatInterval: 10 * time.Millisecond}}
				agents, pub := listen(t), listen(t)
				var wg sync.WaitGroup
				wg.Go(func() { srv.ServeAgents(agents) })
				wg.Go(func() { srv.ServeHTTPListener(pub) })
				c := &agent.Client{Addrs: []string{agents.Addr().String()}, HeartbeatInterval: 10 * time.Millisecond}
				l, err := c.Listen(context.Background(), "app")
				if err != nil {
					t.Fatal(err)
				}
				served := make(chan struct{})
				go func() { defer close(served); http.Serve(l, nameHandler("app")) }()
				tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, pub.Addr().String())
				}}
				for range 5 {
					resp, err := (&http.Client{Transport: tr}).Get("http://app.example.test/")
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				tr.CloseIdleConnections()
				if how == "Close" {
					srv.Close()
				} else if err := srv.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
				wg.Wait()
				// The agent sees its session end and tries to reconnect
				// until it is closed; Close waits for its goroutines.
				c.Close()
				<-served
			}()
			testwait.Goroutines(t, base)
		})
	}
}

// TestCurlUploadWithExpectContinue: curl sends "Expect: 100-continue"
// before a large body; the upload goes through the tunnel whole.
func TestCurlUploadWithExpectContinue(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	te := startEdge(t)
	te.serveApp(t, "up", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	}))
	body := filepath.Join(t.TempDir(), "body")
	data := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB
	if err := os.WriteFile(body, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(te.httpAddr)
	out, err := exec.Command("curl", "-sS", "-v", "--max-time", "30", "--resolve", "up.example.test:"+port+":127.0.0.1",
		"--data-binary", "@"+body, te.url("up")+"/").CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	sum := sha256.Sum256(data)
	if want := fmt.Sprintf("%d %x", len(data), sum); !strings.Contains(string(out), want) {
		t.Fatalf("curl got %q, want %q", out[max(0, len(out)-300):], want)
	}
	if !strings.Contains(string(out), "Expect: 100-continue") {
		t.Log("curl did not send Expect: 100-continue this time")
	}
}
