package edge_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// clusterEdge is one edge of a cluster on loopback: agents, HTTP, TLS and a
// relay listener, sharing a router.Router with the others.
type clusterEdge struct {
	srv                                     *edge.Server
	relay                                   *relay.Relay
	agentAddr, httpAddr, tlsAddr, relayAddr string
}

// startCluster starts edges sharing rt, named by their relay addresses,
// relaying to each other with certificates from one CA. The TCP endpoints
// of edge i listen on hosts[i].
func startCluster(t testing.TB, rt router.Router, hosts ...string) []*clusterEdge {
	t.Helper()
	return startClusterOf(t, testpki.New(t), rt, nil, hosts...)
}

// startClusterOf is startCluster with the CA that issues the edges'
// relay certificates, and configure (when not nil) called on each Server
// and its Relay before they start.
func startClusterOf(t testing.TB, ca *testpki.CA, rt router.Router, configure func(*edge.Server, *relay.Relay), hosts ...string) []*clusterEdge {
	t.Helper()
	var edges []*clusterEdge
	for _, host := range hosts {
		agents, httpLn, tlsLn, relayLn := listen(t), listen(t), listen(t), listen(t)
		srv := &edge.Server{
			ID:            relayLn.Addr().String(),
			Domain:        "example.test",
			HTTPPort:      portOf(httpLn),
			TLSPort:       portOf(tlsLn),
			Router:        rt,
			TCPPorts:      edge.PortRange{Min: 1024, Max: 65535},
			TCPListenHost: host,
		}
		rl := &relay.Relay{Server: srv, TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{ca.IssueEdge(t, []string{srv.ID}, "127.0.0.1")},
			RootCAs:      ca.Pool,
			ClientCAs:    ca.Pool,
		}}
		srv.Dialer = rl
		if configure != nil {
			configure(srv, rl)
		}
		var wg sync.WaitGroup
		wg.Go(func() { srv.ServeAgents(agents) })
		wg.Go(func() { srv.ServeHTTPListener(httpLn) })
		wg.Go(func() { srv.ServeSNI(tlsLn) })
		wg.Go(func() { rl.Serve(relayLn) })
		t.Cleanup(func() { rl.Close(); srv.Close(); wg.Wait() })
		edges = append(edges, &clusterEdge{srv: srv, relay: rl, agentAddr: agents.Addr().String(), httpAddr: httpLn.Addr().String(), tlsAddr: tlsLn.Addr().String(), relayAddr: relayLn.Addr().String()})
	}
	return edges
}

// TestRelayAcrossEdges: three edges share one router.Router; an agent on edge A
// serves http, tls and tcp endpoints; clients of edges B and C reach it,
// the app sees exactly one X-Forwarded-For hop, and the client's own
// address and port as RemoteAddr.
func TestRelayAcrossEdges(t *testing.T) {
	t.Parallel()
	rt := &router.MemoryRouter{}
	// TCP endpoints listen on every edge: in one process, only one edge per
	// loopback address can have the port, so A listens on 127.0.0.1, B on
	// ::1, and C, also on 127.0.0.1, fails to (and says so in its log).
	edges := startCluster(t, rt, "127.0.0.1", "::1", "127.0.0.1")
	a, b, c := edges[0], edges[1], edges[2]

	ag := &agent.Client{Addrs: []string{a.agentAddr}}
	defer ag.Close()
	hl, err := ag.Listen(context.Background(), "http://app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "remote=%s xff=%s xfp=%s", r.RemoteAddr, r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Proto"))
	}))
	pki := testpki.New(t)
	tl, err := ag.Listen(context.Background(), "tls://secure.example.test")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{pki.Issue(t, "secure.example.test")}}), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls remote=%s", r.RemoteAddr)
	}))
	cl, err := ag.Listen(context.Background(), "tcp://")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := cl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				line, _ := bufio.NewReader(conn).ReadString('\n')
				fmt.Fprintf(conn, "tcp remote=%s echo=%s", conn.RemoteAddr(), line)
			}()
		}
	}()

	for _, e := range []*clusterEdge{b, c, a} {
		// HTTP: the client's address, port included, reaches the app.
		var local string
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { local = i.Conn.LocalAddr().String() }}
		tr := &http.Transport{DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, e.httpAddr)
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "http://app.example.test/", nil)
		body := mustRead(t)((&http.Client{Transport: tr}).Do(req))
		tr.CloseIdleConnections()
		if want := "remote=" + local + " xff=127.0.0.1 xfp=http"; body != want {
			t.Errorf("http via edge %s: app saw %q, want %q", e.srv.ID, body, want)
		}

		// TLS passed through, end to end.
		ttr := &http.Transport{
			DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, n, e.tlsAddr)
			},
			TLSClientConfig: &tls.Config{RootCAs: pki.Pool},
		}
		body = mustRead(t)((&http.Client{Transport: ttr}).Get("https://secure.example.test/"))
		ttr.CloseIdleConnections()
		if !strings.HasPrefix(body, "tls remote=127.0.0.1:") {
			t.Errorf("tls via edge %s: %q", e.srv.ID, body)
		}
	}

	// TCP: the port listens on the other edge too, once it heard of the
	// route.
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(cl.URL(), "tcp://"))
	for _, host := range []string{"::1"} {
		addr := net.JoinHostPort(host, port)
		var conn net.Conn
		testwait.For(t, func() bool {
			conn, err = net.Dial("tcp", addr)
			return err == nil
		})
		fmt.Fprintf(conn, "ping\n")
		got, _ := io.ReadAll(conn)
		conn.Close()
		if want := "tcp remote=" + conn.LocalAddr().String() + " echo=ping\n"; string(got) != want {
			t.Errorf("tcp via %s: %q, want %q", addr, got, want)
		}
	}

	// The agent goes: the other edge stops listening on its port.
	ag.Close()
	for _, host := range []string{"::1"} {
		testwait.For(t, func() bool {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), time.Second)
			if err == nil {
				conn.Close()
			}
			return err != nil
		})
	}
}

// TestRelayRefusesUnknownEdges: a peer without a certificate of the
// cluster's CA gets no relay session.
func TestRelayRefusesUnknownEdges(t *testing.T) {
	t.Parallel()
	edges := startCluster(t, &router.MemoryRouter{}, "127.0.0.1")
	stranger := testpki.New(t)
	conn, err := tls.Dial("tcp", edges[0].relayAddr, &tls.Config{
		Certificates:       []tls.Certificate{stranger.Issue(t, "127.0.0.1")},
		InsecureSkipVerify: true,
	})
	if err == nil {
		// TLS 1.3 clients learn of a refused certificate at their first read.
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a stranger's relay session: %v", err)
	}
}

// BenchmarkRelayHTTPRatio measures a small HTTP request through a relay hop
// (client -> edge B -> relay -> edge A -> agent) against the same request
// served by the edge holding the agent (client -> edge A -> agent), in one
// run, interleaved, from benchWorkers keep-alive clients and from one.
// The target is a ratio of at least 0.7.
func BenchmarkRelayHTTPRatio(b *testing.B) {
	edges := startCluster(b, &router.MemoryRouter{}, "127.0.0.1", "127.0.0.1")
	a, relayed := edges[0], edges[1]
	ag := &agent.Client{Addrs: []string{a.agentAddr}}
	b.Cleanup(func() { ag.Close() })
	l, err := ag.Listen(context.Background(), "http://bench")
	if err != nil {
		b.Fatal(err)
	}
	go http.Serve(l, helloHandler)
	local := benchTarget{url: "http://bench.example.test/", client: benchClient(b, a.httpAddr)}
	remote := benchTarget{url: "http://bench.example.test/", client: benchClient(b, relayed.httpAddr)}
	warm(b, local)
	warm(b, remote)
	for _, workers := range []int{benchWorkers, 1} {
		b.Run(fmt.Sprintf("conns=%d", workers), func(b *testing.B) {
			benchmarkRatio(b, local, remote, workers)
		})
	}
}

// TestRelayedRequestDuringBind: a request relayed to the edge whose bind
// of the name is in the Router, and not yet done on that edge, waits for
// the bind rather than failing. The Router shows the bind to edge A before
// edge B's Bind returns (as etcd's watchers may hear of it first); A's
// client then asks for the name, A relays it to B, and only then does B's
// bind go on. It failed with 502 app_error: B closed the relay stream, its
// session holding no such endpoint yet.
func TestRelayedRequestDuringBind(t *testing.T) {
	t.Parallel()
	waiting := make(chan struct{}) // B's relay stream waits for the bind
	var once sync.Once
	logs := slog.New(signalOn{msg: "relay stream waits for the binds under way", seen: func() { once.Do(func() { close(waiting) }) }})
	rt := &afterBind{Router: &router.MemoryRouter{}}
	edges := startClusterOf(t, testpki.New(t), rt, func(s *edge.Server, _ *relay.Relay) {
		s.Logger = logs
	}, "127.0.0.1", "127.0.0.1")
	a, b := edges[0], edges[1]

	type result struct {
		code int
		body string
		err  error
	}
	results := make(chan result, 1)
	rt.after = func(r router.Route) {
		if r.Edge != b.srv.ID {
			return
		}
		go func() {
			code, body, err := getThrough(&http.Client{Timeout: 30 * time.Second}, a.httpAddr, "app.example.test", "/")
			results <- result{code, body, err}
		}()
		// B's bind goes on once A's request failed, or waits on B.
		select {
		case res := <-results:
			results <- res
		case <-waiting:
		}
	}
	ag := &agent.Client{Addrs: []string{b.agentAddr}}
	defer ag.Close()
	l, err := ag.Listen(context.Background(), "http://app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app") }))
	res := <-results
	if res.err != nil || res.code != 200 || res.body != "app" {
		t.Fatalf("a request relayed during the bind: %d %q %v; want 200 \"app\"", res.code, res.body, res.err)
	}
}

// afterBind is a router.Router that calls after (when set) with each
// route it bound, before its Bind returns.
type afterBind struct {
	router.Router
	after func(router.Route)
}

func (a *afterBind) Bind(ctx context.Context, r router.Route) error {
	err := a.Router.Bind(ctx, r)
	if err == nil && a.after != nil {
		a.after(r)
	}
	return err
}

// signalOn is a slog.Handler that calls seen for each record, at any
// level, whose message is msg.
type signalOn struct {
	msg  string
	seen func()
}

func (h signalOn) Enabled(context.Context, slog.Level) bool { return true }
func (h signalOn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.seen()
	}
	return nil
}
func (h signalOn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalOn) WithGroup(string) slog.Handler      { return h }
