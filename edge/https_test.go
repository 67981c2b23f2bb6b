package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// httpsEdge is an edge with agents, plain HTTP and TLS (https and tls
// endpoints side by side) on loopback, with a wildcard certificate for
// *.example.test from a test CA.
type httpsEdge struct {
	srv       *edge.Server
	pki       *testpki.CA
	agentAddr string
	httpAddr  string
	tlsAddr   string
}

func startHTTPSEdge(t testing.TB, configure func(*edge.Server)) *httpsEdge {
	t.Helper()
	pki := testpki.New(t)
	agents, httpLn, tlsLn := listen(t), listen(t), listen(t)
	_, httpPort, _ := net.SplitHostPort(httpLn.Addr().String())
	_, tlsPort, _ := net.SplitHostPort(tlsLn.Addr().String())
	srv := &edge.Server{
		Domain:       "example.test",
		HTTPPort:     httpPort,
		TLSPort:      tlsPort,
		Certificates: []tls.Certificate{pki.Issue(t, "*.example.test")},
	}
	if configure != nil {
		configure(srv)
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(httpLn) })
	wg.Go(func() { srv.ServeSNI(tlsLn) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return &httpsEdge{srv: srv, pki: pki, agentAddr: agents.Addr().String(), httpAddr: httpLn.Addr().String(), tlsAddr: tlsLn.Addr().String()}
}

// client returns an HTTP client that reaches the edge's TLS port for every
// name (as a wildcard DNS record would), trusting the test CA: HTTP/2 when
// h2, else HTTP/1.1.
func (e *httpsEdge) client(t testing.TB, h2 bool) *http.Client {
	p := new(http.Protocols)
	if h2 {
		p.SetHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, e.tlsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.pki.Pool},
		Protocols:       p,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// plainClient returns a client of the edge's HTTP port: HTTP/2 with prior
// knowledge when h2c, else HTTP/1.1. It follows no redirect.
func (e *httpsEdge) plainClient(t testing.TB, h2c bool) *http.Client {
	p := new(http.Protocols)
	if h2c {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, e.httpAddr)
		},
		Protocols: p,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport:     tr,
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// serve binds ep with an agent of its own and serves h on the listener
// (HTTP/1.1, and HTTP/2 with prior knowledge for an h2c endpoint).
func (e *httpsEdge) serve(t testing.TB, ep agent.Endpoint, h http.Handler) *agent.Listener {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	l, err := c.ListenEndpoint(context.Background(), ep)
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: h, Protocols: p}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(l) }()
	t.Cleanup(func() { c.Close(); hs.Close(); <-done })
	return l
}

// echoInfo answers with what the app saw of the request.
var echoInfo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "host=%s proto=%s xfp=%s xff=%s path=%s", r.Host, r.Proto, r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-For"), r.URL.Path)
})

// mustRead returns a func that reads a response's body whole, failing t on
// any error: mustRead(t)(client.Get(url)).
func mustRead(t testing.TB) func(*http.Response, error) string {
	return func(resp *http.Response, err error) string {
		t.Helper()
		return readAll(t, resp, err)
	}
}

func readAll(t testing.TB, resp *http.Response, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHTTPSEndpointBesideTLSPassthrough(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
	l := e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	if want := "https://app.example.test:" + tlsPort; l.URL() != want {
		t.Fatalf("URL = %q, want %q", l.URL(), want)
	}
	// A tls endpoint on the same port: its app terminates TLS with a
	// certificate of its own, which the client sees.
	appCA := testpki.New(t)
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	tl, err := c.Listen(context.Background(), "tls://pass.example.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go http.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{appCA.Issue(t, "pass.example.test")}}), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "passed through")
	}))

	for _, h2 := range []bool{true, false} {
		resp, err := e.client(t, h2).Get("https://app.example.test/x")
		if err != nil {
			t.Fatal(err)
		}
		wantProto := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[h2]
		if resp.Proto != wantProto {
			t.Errorf("client got %s, want %s", resp.Proto, wantProto)
		}
		body := readAll(t, resp, nil)
		if want := "host=app.example.test proto=HTTP/1.1 xfp=https xff=127.0.0.1 path=/x"; body != want {
			t.Errorf("app saw %q, want %q", body, want)
		}
	}
	// The tls name is passed through: the edge's CA does not verify it,
	// the app's does.
	if _, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "pass.example.test", RootCAs: e.pki.Pool}); err == nil {
		t.Error("the edge's CA verified a passed-through name")
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, e.tlsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: appCA.Pool},
	}
	defer tr.CloseIdleConnections()
	if body := mustRead(t)((&http.Client{Transport: tr}).Get("https://pass.example.test/")); body != "passed through" {
		t.Errorf("tls endpoint answered %q", body)
	}
	// A name nobody bound gets no handshake.
	if _, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "nobody.example.test", RootCAs: e.pki.Pool}); err == nil {
		t.Error("handshake for an unbound name")
	}
}

func TestHTTPSBindNeedsCertificates(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, func(s *edge.Server) { s.Certificates = nil })
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	defer c.Close()
	_, err := c.Listen(context.Background(), "https://app")
	if err == nil || !strings.Contains(err.Error(), "no https endpoints") {
		t.Fatalf("bind https without certificates: %v", err)
	}
	// Unknown endpoint options are refused, not ignored.
	_, err = c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "tls://x.example.test", AppProtocol: "h2c"})
	if err == nil {
		t.Fatal("h2c on a tls endpoint accepted")
	}
}

func TestPlainHTTPForHTTPSOnlyName(t *testing.T) {
	t.Parallel()
	for _, redirect := range []bool{false, true} {
		t.Run(fmt.Sprint("redirect=", redirect), func(t *testing.T) {
			e := startHTTPSEdge(t, func(s *edge.Server) { s.RedirectHTTP = redirect })
			_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
			e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
			resp, err := e.plainClient(t, false).Get("http://app.example.test/a/b?c=d")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := "https://app.example.test:" + tlsPort + "/a/b?c=d"
			if redirect {
				if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
					t.Fatalf("got %d to %q, want 308 to %q", resp.StatusCode, resp.Header.Get("Location"), want)
				}
				return
			}
			if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Tunnelkit-Error") != "https_only" {
				t.Fatalf("got %d %q, want 404 https_only", resp.StatusCode, resp.Header.Get("Tunnelkit-Error"))
			}
		})
	}
}

func TestH2CPriorKnowledgeOnHTTPPort(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "http://app"}, echoInfo)
	c := e.plainClient(t, true)
	for range 3 {
		resp, err := c.Get("http://app.example.test/h2c")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Proto != "HTTP/2.0" {
			t.Errorf("client got %s, want HTTP/2.0", resp.Proto)
		}
		if body := readAll(t, resp, nil); body != "host=app.example.test proto=HTTP/1.1 xfp=http xff=127.0.0.1 path=/h2c" {
			t.Errorf("app saw %q", body)
		}
	}
}

// trailerEcho answers with the request's trailers, read after its body.
var trailerEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	fmt.Fprintf(w, "%d bytes; checksum=%q; te=%q", n, r.Trailer.Get("Checksum"), r.Header.Get("Te"))
})

func TestRequestTrailersReachTheApp(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "http://plain"}, trailerEcho)
	e.serve(t, agent.Endpoint{URL: "https://secure"}, trailerEcho)
	e.serve(t, agent.Endpoint{URL: "https://grpc", AppProtocol: "h2c"}, trailerEcho)
	clients := map[string]*http.Client{
		"h1 http://plain":     e.plainClient(t, false),
		"h2c http://plain":    e.plainClient(t, true),
		"h2 https://secure":   e.client(t, true),
		"h1 https://secure":   e.client(t, false),
		"h2 https://grpc":     e.client(t, true),
		"h1 https://grpc":     e.client(t, false),
		"h2 https://secure#2": e.client(t, true),
	}
	for name, c := range clients {
		url := strings.TrimSuffix(strings.Fields(name)[1], "#2") + ".example.test/"
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", url, pr)
		req.Trailer = http.Header{"Checksum": nil}
		go func() {
			io.WriteString(pw, "hello, ")
			io.WriteString(pw, "trailers")
			req.Trailer.Set("Checksum", "sum-42")
			pw.Close()
		}()
		body := mustRead(t)(c.Do(req))
		if want := `15 bytes; checksum="sum-42"`; !strings.HasPrefix(body, want) {
			t.Errorf("%s: app saw %q, want %q", name, body, want)
		}
	}
}

// TestGRPCStyleBidiStream runs a stream both ways at once, as gRPC does,
// through an https endpoint whose app speaks HTTP/2 without TLS: each
// message the client sends comes back before the client sends the next,
// and the app's status comes in a trailer.
func TestGRPCStyleBidiStream(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "https://grpc", AppProtocol: "h2c"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.Header.Get("Content-Type") != "application/grpc" {
			http.Error(w, "want HTTP/2 gRPC, got "+r.Proto, http.StatusBadRequest)
			return
		}
		w.Header().Set("Trailer", "Grpc-Status")
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		rc.Flush()
		sc := bufio.NewScanner(r.Body)
		n := 0
		for sc.Scan() {
			n++
			fmt.Fprintf(w, "echo %s\n", sc.Text())
			rc.Flush()
		}
		w.Header().Set("Grpc-Status", fmt.Sprint(n))
	}))
	c := e.client(t, true)
	for round := range 2 { // the second stream reuses the public connection's HTTP/2 connection to the app
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", "https://grpc.example.test/echo.Echo/Stream", pr)
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("round %d: %s %d %s", round, resp.Proto, resp.StatusCode, b)
		}
		br := bufio.NewReader(resp.Body)
		for i := range 5 {
			fmt.Fprintf(pw, "message %d\n", i)
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("round %d, message %d: %v", round, i, err)
			}
			if want := fmt.Sprintf("echo message %d\n", i); line != want {
				t.Fatalf("got %q, want %q", line, want)
			}
		}
		pw.Close()
		if rest, _ := io.ReadAll(br); len(rest) != 0 {
			t.Errorf("extra bytes %q", rest)
		}
		resp.Body.Close()
		if got := resp.Trailer.Get("Grpc-Status"); got != "5" {
			t.Errorf("round %d: Grpc-Status trailer %q, want 5", round, got)
		}
	}
}

func TestH2CAppManyConcurrentRequests(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "https://app", AppProtocol: "h2c"}, echoInfo)
	c := e.client(t, true)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			resp, err := c.Get(fmt.Sprintf("https://app.example.test/%d", i))
			if err != nil {
				errs <- err
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("host=app.example.test proto=HTTP/2.0 xfp=https xff=127.0.0.1 path=/%d", i); err != nil || string(b) != want {
				errs <- fmt.Errorf("got %q, %v; want %q", b, err, want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMisdirectedRequestOnCoalescedConnection(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	e.serve(t, agent.Endpoint{URL: "http://plainonly"}, echoInfo)
	// A client that reuses its connection to app for another name the
	// wildcard certificate covers (as browsers coalesce HTTP/2).
	conn, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "app.example.test", RootCAs: e.pki.Pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: plainonly.example.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("got %d, want 421", resp.StatusCode)
	}
}

func TestAccessLog(t *testing.T) {
	t.Parallel()
	var buf testtools.Buffer
	e := startHTTPSEdge(t, func(s *edge.Server) { s.AccessLog = slog.New(slog.NewTextHandler(&buf, nil)) })
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	e.serve(t, agent.Endpoint{URL: "http://plain"}, echoInfo)
	secure := mustRead(t)(e.client(t, true).Get("https://app.example.test/secure/path"))
	plain := mustRead(t)(e.plainClient(t, false).Get("http://plain.example.test/plain"))
	mustRead(t)(e.plainClient(t, false).Get("http://nobody.example.test/missing"))
	log := buf.String()
	for _, want := range []string{
		fmt.Sprintf("method=GET host=app.example.test path=/secure/path proto=HTTP/2.0 status=200 bytes=%d", len(secure)),
		fmt.Sprintf("method=GET host=plain.example.test path=/plain proto=HTTP/1.1 status=200 bytes=%d", len(plain)),
		"path=/missing proto=HTTP/1.1 status=404",
		"error=no_endpoint",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("access log lacks %q:\n%s", want, log)
		}
	}
}

// TestHostileTLSClientsOfHTTPS: clients that stall in the handshake, send
// garbage after it, or lie about ALPN get closed, and the endpoint keeps
// serving.
func TestHostileTLSClientsOfHTTPS(t *testing.T) {
	t.Parallel()
	// The bound is short for a test, but long enough for the good
	// client's handshake at the end on a busy machine.
	e := startHTTPSEdge(t, func(s *edge.Server) { s.Timeouts.Handshake = 3 * time.Second })
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)

	// A ClientHello for app, then silence: closed after the handshake
	// timeout.
	raw, err := net.Dial("tcp", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write(clientHelloFor(t, "app.example.test"))
	raw.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(io.Discard, raw); err != nil {
		t.Errorf("stalled handshake: %v (want the edge to close it)", err)
	}

	// Garbage after a good handshake.
	conn, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "app.example.test", RootCAs: e.pki.Pool, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(bytes.Repeat([]byte{0xff}, 4096))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, conn)
	conn.Close()

	// An ACME challenge handshake on an edge without ACME fails.
	if c, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "app.example.test", InsecureSkipVerify: true, NextProtos: []string{"acme-tls/1"}}); err == nil {
		c.Close()
		t.Error("acme-tls/1 handshake accepted on an edge without ACME")
	}

	if body := mustRead(t)(e.client(t, true).Get("https://app.example.test/after")); !strings.Contains(body, "path=/after") {
		t.Errorf("after hostile clients: %q", body)
	}
}

// TestHTTPSAndHTTPSameNameSameOwner: one identity may bind a name over http
// and https at once; each scheme reaches its own endpoint.
func TestHTTPSAndHTTPSameNameSameOwner(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, func(s *edge.Server) { s.Authenticate = identityIsToken })
	for _, scheme := range []string{"http", "https"} {
		c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "alice"}
		l, err := c.Listen(context.Background(), scheme+"://both")
		if err != nil {
			t.Fatal(err)
		}
		go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, scheme) }))
		t.Cleanup(func() { c.Close() })
	}
	if got := mustRead(t)(e.plainClient(t, false).Get("http://both.example.test/")); got != "http" {
		t.Errorf("http got %q", got)
	}
	if got := mustRead(t)(e.client(t, true).Get("https://both.example.test/")); got != "https" {
		t.Errorf("https got %q", got)
	}
	// Another identity cannot take the name over https.
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "mallory"}
	defer c.Close()
	if _, err := c.Listen(context.Background(), "https://both"); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("another identity's https bind: %v, want ErrNameTaken", err)
	}
}

// TestHTTP2ConnectionOutlivesItsRequests: requests, with or without a body
// the app leaves unread, never end a client's HTTP/2 connection (a
// "Connection: close" on an HTTP/2 response makes net/http send GOAWAY).
func TestHTTP2ConnectionOutlivesItsRequests(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	c := e.client(t, true)
	conns := 0
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			conns++
		}
	}}
	for i := range 20 {
		var body io.Reader
		method := "GET"
		if i%2 == 1 {
			method, body = "POST", strings.NewReader(strings.Repeat("x", 100<<10)) // echoInfo never reads it
		}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, "https://app.example.test/", body)
		mustRead(t)(c.Do(req))
	}
	if conns != 1 {
		t.Errorf("20 requests took %d connections, want 1", conns)
	}
}

// TestH2CAppThatLies: an h2c endpoint whose "app" answers with bytes that
// are not HTTP/2, or closes without a word: the client gets a 502 and the
// edge serves the next request. (An app that stays silent is waited for,
// up to ResponseHeaderTimeout, as over HTTP/1.1.)
func TestH2CAppThatLies(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, nil)
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	defer c.Close()
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "https://liar", AppProtocol: "h2c"})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if n.Add(1)%2 == 1 {
					conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno"))
				}
			}()
		}
	}()
	client := e.client(t, true)
	for i := range 4 {
		resp, err := client.Get(fmt.Sprintf("https://liar.example.test/%d", i))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("request %d: status %d, want 502", i, resp.StatusCode)
		}
	}
	e.serve(t, agent.Endpoint{URL: "https://honest", AppProtocol: "h2c"}, echoInfo)
	if body := mustRead(t)(client.Get("https://honest.example.test/ok")); !strings.Contains(body, "path=/ok") {
		t.Errorf("after the liar: %q", body)
	}
}
