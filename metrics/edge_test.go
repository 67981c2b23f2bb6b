package metrics_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/metrics"
)

var (
	_ edge.Observer       = (*metrics.Edge)(nil)
	_ edge.HealthObserver = (*metrics.Edge)(nil)
)

// testEdge is an edge with agents, plain HTTP, TLS (https and tls
// endpoints) and TCP endpoints on loopback, a wildcard certificate for
// *.example.test from a test CA, and every token but "bad" accepted.
type testEdge struct {
	srv       *edge.Server
	pki       *testpki.CA
	agentAddr string
	httpAddr  string
	tlsAddr   string
}

func startEdge(t testing.TB, obs edge.Observer) *testEdge {
	t.Helper()
	pki := testpki.New(t)
	agents, httpLn, tlsLn := listen(t), listen(t), listen(t)
	_, httpPort, _ := net.SplitHostPort(httpLn.Addr().String())
	_, tlsPort, _ := net.SplitHostPort(tlsLn.Addr().String())
	srv := &edge.Server{
		Domain:       "example.test",
		HTTPPort:     httpPort,
		TLSPort:      tlsPort,
		TCPPorts:     edge.PortRange{Min: 1024, Max: 65535},
		Certificates: []tls.Certificate{pki.Issue(t, "*.example.test")},
		Authenticate: func(_ context.Context, token string) (string, error) {
			if token == "bad" {
				return "", errors.New("bad token")
			}
			return "id-" + token, nil
		},
		Observer: obs,
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(httpLn) })
	wg.Go(func() { srv.ServeSNI(tlsLn) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return &testEdge{srv: srv, pki: pki, agentAddr: agents.Addr().String(), httpAddr: httpLn.Addr().String(), tlsAddr: tlsLn.Addr().String()}
}

// client returns an HTTP/1.1 client that sends every request to addr, on a
// new connection each, trusting pool for TLS.
func client(t testing.TB, addr string, pool *tls.Config) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		TLSClientConfig:   pool,
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// serveHTTP binds url with c and serves h on the listener until cleanup.
func serveHTTP(t testing.TB, c *agent.Client, url string, h http.Handler) {
	t.Helper()
	l, err := c.Listen(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	var wg sync.WaitGroup
	wg.Go(func() { hs.Serve(l) })
	t.Cleanup(func() { hs.Close(); wg.Wait() })
}

// serveConns accepts l's connections (until it closes) and gives each to
// handle, which closes it.
func serveConns(t testing.TB, l net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { handle(c) })
		}
	})
	t.Cleanup(func() { l.Close(); wg.Wait() })
}

// app answers "hello" on /, its own 404 on /missing, and on /crash closes
// the connection without an answer.
var app = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	switch r.URL.Path {
	case "/missing":
		http.NotFound(w, r)
	case "/crash":
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	default:
		io.WriteString(w, "hello")
	}
})

func get(t testing.TB, c *http.Client, method, url, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestEdgeMetrics runs sessions, endpoints of every protocol, requests
// (2xx, the app's 404, a 404 for a name nobody bound, a 502 for an app that
// hangs up), TLS and TCP connections, a TLS name nobody bound and a refused
// token through an edge, scrapes its metrics over HTTP and checks that
// each moved as it should; then the agent closes and the gauges go back
// to zero.
func TestEdgeMetrics(t *testing.T) {
	m := metrics.NewEdge()
	url := serveMetrics(t, m)
	e := startEdge(t, m)

	// Before anything: every known series is there, at zero, and nothing
	// is counted as "other".
	s := waitMetrics(t, url,
		eq("tunnelkit_edge_sessions", 0),
		eq("tunnelkit_edge_streams", 0),
		eq(`tunnelkit_edge_endpoints{proto="tcp"}`, 0),
		eq(`tunnelkit_edge_connections_total{proto="https"}`, 0),
		eq(`tunnelkit_edge_bytes_total{direction="out",proto="tls"}`, 0),
		eq(`tunnelkit_edge_http_requests_total{code="5xx",proto="https"}`, 0),
		eq(`tunnelkit_edge_http_request_duration_seconds_count{proto="http"}`, 0),
		eq(`tunnelkit_edge_refused_total{reason="routing_unavailable"}`, 0),
	)
	for k := range s {
		if strings.Contains(k, `"other"`) {
			t.Errorf("series %s before anything happened", k)
		}
	}

	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "good"}
	t.Cleanup(func() { c.Close() })
	serveHTTP(t, c, "http://app", app)
	serveHTTP(t, c, "https://secure", app)
	tl, err := c.Listen(context.Background(), "tls://pass.example.test")
	if err != nil {
		t.Fatal(err)
	}
	passCfg := &tls.Config{Certificates: []tls.Certificate{e.pki.Issue(t, "pass.example.test")}}
	serveConns(t, tl, func(conn net.Conn) {
		// The app closes the agent's conn, not the tls.Conn: tls.Conn.Close
		// sets a write deadline in the past before it closes the conn under
		// it, and agent.Conn.Close then loses the stream's FIN now and then
		// (muxado sends it under that deadline), which leaves the edge's
		// copy waiting for its idle timeout.
		defer conn.Close()
		tc := tls.Server(conn, passCfg)
		line, _ := bufio.NewReader(tc).ReadString('\n')
		fmt.Fprintf(tc, "pass: %s", line)
	})
	tcpL, err := c.Listen(context.Background(), "tcp://")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, tcpL, func(conn net.Conn) {
		defer conn.Close()
		io.ReadFull(conn, make([]byte, 5))
		io.WriteString(conn, "world!")
	})
	waitMetrics(t, url,
		eq("tunnelkit_edge_sessions", 1),
		eq(`tunnelkit_edge_endpoints{proto="http"}`, 1),
		eq(`tunnelkit_edge_endpoints{proto="https"}`, 1),
		eq(`tunnelkit_edge_endpoints{proto="tls"}`, 1),
		eq(`tunnelkit_edge_endpoints{proto="tcp"}`, 1),
	)

	// HTTP, a connection per request.
	plain := client(t, e.httpAddr, nil)
	for range 3 {
		if code := get(t, plain, "GET", "http://app.example.test/", ""); code != 200 {
			t.Fatalf("GET /: %d", code)
		}
	}
	if code := get(t, plain, "POST", "http://app.example.test/", "12345"); code != 200 {
		t.Fatalf("POST /: %d", code)
	}
	if code := get(t, plain, "GET", "http://app.example.test/missing", ""); code != 404 {
		t.Fatalf("GET /missing: %d", code)
	}
	if code := get(t, plain, "GET", "http://nobody.example.test/", ""); code != 404 {
		t.Fatalf("GET nobody: %d", code)
	}
	if code := get(t, plain, "GET", "http://app.example.test/crash", ""); code != 502 {
		t.Fatalf("GET /crash: %d", code)
	}
	// HTTPS, terminated by the edge.
	secure := client(t, e.tlsAddr, &tls.Config{RootCAs: e.pki.Pool})
	for range 2 {
		if code := get(t, secure, "GET", "https://secure.example.test/", ""); code != 200 {
			t.Fatalf("GET https: %d", code)
		}
	}
	// TLS passed through to the app.
	tc, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "pass.example.test", RootCAs: e.pki.Pool})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(tc, "ping\n")
	if line, err := bufio.NewReader(tc).ReadString('\n'); err != nil || line != "pass: ping\n" {
		t.Fatalf("tls: %q, %v", line, err)
	}
	tc.Close()
	// A TLS name nobody bound: the edge closes the connection.
	nc, err := net.Dial("tcp", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if err := tls.Client(nc, &tls.Config{ServerName: "nobody.example.test"}).Handshake(); err == nil {
		t.Fatal("handshake for a name nobody bound")
	}
	nc.Close()
	// TCP.
	tcpConn, err := net.Dial("tcp", strings.TrimPrefix(tcpL.URL(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(tcpConn, "hello")
	if b, err := io.ReadAll(tcpConn); err != nil || string(b) != "world!" {
		t.Fatalf("tcp: %q, %v", b, err)
	}
	tcpConn.Close()
	// A refused token.
	bad := &agent.Client{Addrs: []string{e.agentAddr}, Token: "bad"}
	if _, err := bad.Listen(context.Background(), "http://x"); !errors.Is(err, agent.ErrUnauthorized) {
		t.Fatalf("bad token: %v", err)
	}
	bad.Close()

	s = waitMetrics(t, url,
		eq("tunnelkit_edge_sessions", 1),
		eq(`tunnelkit_edge_connections_total{proto="http"}`, 7),
		eq(`tunnelkit_edge_connections_total{proto="https"}`, 2),
		eq(`tunnelkit_edge_connections_total{proto="tls"}`, 2), // the one passed through and the one refused
		eq(`tunnelkit_edge_connections_total{proto="tcp"}`, 1),
		eq(`tunnelkit_edge_http_requests_total{code="2xx",proto="http"}`, 4),
		eq(`tunnelkit_edge_http_requests_total{code="4xx",proto="http"}`, 2),
		eq(`tunnelkit_edge_http_requests_total{code="5xx",proto="http"}`, 1),
		eq(`tunnelkit_edge_http_requests_total{code="2xx",proto="https"}`, 2),
		eq(`tunnelkit_edge_http_requests_total{code="3xx",proto="http"}`, 0),
		eq(`tunnelkit_edge_http_request_duration_seconds_count{proto="http"}`, 7),
		eq(`tunnelkit_edge_http_request_duration_seconds_count{proto="https"}`, 2),
		eq(`tunnelkit_edge_bytes_total{direction="in",proto="http"}`, 5),
		atLeast(`tunnelkit_edge_bytes_total{direction="out",proto="http"}`, 4*5), // 4 hellos, and error pages
		eq(`tunnelkit_edge_bytes_total{direction="out",proto="https"}`, 2*5),
		atLeast(`tunnelkit_edge_bytes_total{direction="in",proto="tls"}`, 100), // a ClientHello at least
		atLeast(`tunnelkit_edge_bytes_total{direction="out",proto="tls"}`, 100),
		eq(`tunnelkit_edge_bytes_total{direction="in",proto="tcp"}`, 5),
		eq(`tunnelkit_edge_bytes_total{direction="out",proto="tcp"}`, 6),
		eq(`tunnelkit_edge_refused_total{reason="no_endpoint"}`, 1),
		eq(`tunnelkit_edge_refused_total{reason="app_error"}`, 1),
		eq(`tunnelkit_edge_refused_total{reason="no_route"}`, 1),
		eq(`tunnelkit_edge_refused_total{reason="auth"}`, 1),
		eq(`tunnelkit_edge_refused_total{reason="client_limit"}`, 0),
	)
	if sum := s[`tunnelkit_edge_http_request_duration_seconds_sum{proto="http"}`]; sum <= 0 || sum > 60 {
		t.Errorf("request durations add up to %g s", sum)
	}
	for k := range s {
		if strings.Contains(k, `"other"`) {
			t.Errorf("series %s", k)
		}
	}

	c.Close()
	waitMetrics(t, url,
		eq("tunnelkit_edge_sessions", 0),
		eq("tunnelkit_edge_streams", 0),
		eq(`tunnelkit_edge_endpoints{proto="http"}`, 0),
		eq(`tunnelkit_edge_endpoints{proto="https"}`, 0),
		eq(`tunnelkit_edge_endpoints{proto="tls"}`, 0),
		eq(`tunnelkit_edge_endpoints{proto="tcp"}`, 0),
	)
}

// TestEdgeUnknownLabels: a protocol, status or reason outside the known
// sets is counted under "other", so that labels stay bounded whatever the
// core reports.
func TestEdgeUnknownLabels(t *testing.T) {
	m := metrics.NewEdge()
	url := serveMetrics(t, m)
	m.Conn("quic")
	m.Endpoint("quic", 1)
	m.Bytes("quic", 3, 4)
	m.Bytes("tcp", -1, 2) // a count that went wrong is dropped, not a panic
	m.Request("http", 0, time.Millisecond)
	m.Request("http", 999, time.Millisecond)
	m.Request("quic", 200, time.Millisecond)
	m.Refused("some_new_reason")
	m.Refused("Auth")
	waitMetrics(t, url,
		eq(`tunnelkit_edge_connections_total{proto="other"}`, 1),
		eq(`tunnelkit_edge_endpoints{proto="other"}`, 1),
		eq(`tunnelkit_edge_bytes_total{direction="in",proto="other"}`, 3),
		eq(`tunnelkit_edge_bytes_total{direction="out",proto="other"}`, 4),
		eq(`tunnelkit_edge_bytes_total{direction="in",proto="tcp"}`, 0),
		eq(`tunnelkit_edge_bytes_total{direction="out",proto="tcp"}`, 2),
		eq(`tunnelkit_edge_http_requests_total{code="other",proto="http"}`, 2),
		eq(`tunnelkit_edge_http_requests_total{code="2xx",proto="other"}`, 1),
		eq(`tunnelkit_edge_http_request_duration_seconds_count{proto="http"}`, 2),
		eq(`tunnelkit_edge_http_request_duration_seconds_count{proto="other"}`, 1),
		eq(`tunnelkit_edge_refused_total{reason="other"}`, 2),
		eq(`tunnelkit_edge_refused_total{reason="auth"}`, 0),
	)
}

// TestEdgeEndpointsDown: the gauge of endpoints whose app is down goes up
// and down with the edge's health reports, by protocol.
func TestEdgeEndpointsDown(t *testing.T) {
	m := metrics.NewEdge()
	url := serveMetrics(t, m)
	m.EndpointDown("http", true)
	m.EndpointDown("http", true)
	m.EndpointDown("tcp", true)
	m.EndpointDown("http", false)
	m.EndpointDown("quic", true)
	waitMetrics(t, url,
		eq(`tunnelkit_edge_endpoints_down{proto="http"}`, 1),
		eq(`tunnelkit_edge_endpoints_down{proto="tcp"}`, 1),
		eq(`tunnelkit_edge_endpoints_down{proto="https"}`, 0),
		eq(`tunnelkit_edge_endpoints_down{proto="other"}`, 1),
	)
}
