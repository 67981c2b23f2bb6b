package edge_test

// Benchmarks of the public HTTP data path and of an idle agent session's
// memory on the edge. Run them with, for example:
//
//	go test ./edge -run '^$' -bench HTTP -benchtime 3s -count 3
//	go test ./edge -run '^$' -bench IdleSession -benchtime 1x -count 3
//
// (BenchmarkIdleSessionHeap opens 1000 sessions per op: give it 1x, not a
// large count.)
//
// BenchmarkHTTPRatio is the one to quote: it interleaves rounds of the
// tunnel and of the baseline in one process, so machine noise (other
// processes, CPU frequency) hits both alike, and reports tunnel/baseline.
// Compare the absolute req/s of BenchmarkHTTPTunnel and
// BenchmarkHTTPReverseProxyBaseline only within one run.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/benchload"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// benchWorkers is the number of concurrent clients, each with its own
// keep-alive connection, in the HTTP benchmarks. It is fixed rather than a
// multiple of GOMAXPROCS so that figures compare across machines.
const benchWorkers = 8

// benchBody is the small response of the benchmarked app.
const benchBody = "hello"

var helloHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte(benchBody))
})

// benchTarget is a URL served through one of the benchmarked paths, with a
// client whose connections all go to that path's front listener.
type benchTarget struct {
	url    string
	client *http.Client
}

// benchClient returns a keep-alive client that sends every request to addr,
// with an idle pool large enough for benchWorkers connections.
func benchClient(tb testing.TB, addr string) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		MaxIdleConns:        4 * benchWorkers,
		MaxIdleConnsPerHost: 4 * benchWorkers,
		DisableCompression:  true,
	}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// startTunnelTarget serves helloHandler through an edge and an agent
// session on loopback: client -> edge.Server -> mux stream -> agent
// listener -> http.Serve.
func startTunnelTarget(tb testing.TB) benchTarget {
	te := startEdge(tb)
	te.serveApp(tb, "bench", helloHandler)
	return benchTarget{url: te.url("bench") + "/", client: benchClient(tb, te.httpAddr)}
}

// startBaselineTarget serves helloHandler behind one plain
// httputil.ReverseProxy hop on loopback: client -> ReverseProxy ->
// http.Server over TCP. The proxy's transport keeps enough idle
// connections for every worker, so the baseline is a well-tuned proxy, and
// it sets the X-Forwarded headers as the edge does.
func startBaselineTarget(tb testing.TB) benchTarget {
	appLn, proxyLn := listen(tb), listen(tb)
	app := &http.Server{Handler: helloHandler}
	target := &url.URL{Scheme: "http", Host: appLn.Addr().String()}
	tr := &http.Transport{
		MaxIdleConns:        4 * benchWorkers,
		MaxIdleConnsPerHost: 4 * benchWorkers,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport: tr,
	}
	proxy := &http.Server{Handler: rp}
	var wg sync.WaitGroup
	wg.Go(func() { app.Serve(appLn) })
	wg.Go(func() { proxy.Serve(proxyLn) })
	tb.Cleanup(func() {
		proxy.Close()
		tr.CloseIdleConnections()
		app.Close()
		wg.Wait()
	})
	return benchTarget{url: "http://bench.example.test/", client: benchClient(tb, proxyLn.Addr().String())}
}

// load sends n GET requests to t from workers concurrent clients and
// returns the time they took (see benchload.Load).
func load(tb testing.TB, t benchTarget, n, workers int) time.Duration {
	return benchload.Load(tb, benchload.Target{URL: t.url, Client: t.client, Body: benchBody}, n, workers)
}

// warm opens every worker's connection (and the connections behind it)
// before timing starts.
func warm(tb testing.TB, t benchTarget) {
	load(tb, t, 50*benchWorkers, benchWorkers)
}

func benchmarkHTTP(b *testing.B, t benchTarget) {
	warm(b, t)
	b.ResetTimer()
	d := load(b, t, b.N, benchWorkers)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/d.Seconds(), "req/s")
}

// BenchmarkHTTPTunnel measures requests per second for a small response
// through the edge and an agent session to an app on agent.Listen, from
// benchWorkers keep-alive clients.
func BenchmarkHTTPTunnel(b *testing.B) {
	benchmarkHTTP(b, startTunnelTarget(b))
}

// BenchmarkHTTPReverseProxyBaseline measures the same app and client
// behind one plain httputil.ReverseProxy on loopback.
func BenchmarkHTTPReverseProxyBaseline(b *testing.B) {
	benchmarkHTTP(b, startBaselineTarget(b))
}

// BenchmarkHTTPRatio reports the tunnel's req/s as a ratio to the
// baseline's, measured in one run in short interleaved rounds, from
// benchWorkers keep-alive clients (throughput) and from one (latency
// bound). One op is one request on each path.
func BenchmarkHTTPRatio(b *testing.B) {
	base := startBaselineTarget(b)
	tun := startTunnelTarget(b)
	warm(b, base)
	warm(b, tun)
	for _, workers := range []int{benchWorkers, 1} {
		b.Run(fmt.Sprintf("conns=%d", workers), func(b *testing.B) {
			benchmarkRatio(b, base, tun, workers)
		})
	}
}

func benchmarkRatio(b *testing.B, base, tun benchTarget, workers int) {
	// Rounds of a few tens of milliseconds, alternating which path goes
	// first, so that noise from the rest of the machine falls on both.
	const perRound = 200
	var dBase, dTun time.Duration
	for done, r := 0, 0; done < b.N; r++ {
		n := min(perRound, b.N-done)
		if r%2 == 0 {
			dBase += load(b, base, n, workers)
			dTun += load(b, tun, n, workers)
		} else {
			dTun += load(b, tun, n, workers)
			dBase += load(b, base, n, workers)
		}
		done += n
	}
	baseRate := float64(b.N) / dBase.Seconds()
	tunRate := float64(b.N) / dTun.Seconds()
	b.ReportMetric(baseRate, "base-req/s")
	b.ReportMetric(tunRate, "tunnel-req/s")
	b.ReportMetric(tunRate/baseRate, "ratio")
}

// Environment of the agent process that BenchmarkIdleSessionHeap starts.
const (
	idleEdgeEnv     = "TUNNELKIT_BENCH_IDLE_EDGE"
	idleSessionsEnv = "TUNNELKIT_BENCH_IDLE_SESSIONS"
	idleCAEnv       = "TUNNELKIT_BENCH_IDLE_CA" // a file of the edge's CA, PEM: the agents speak TLS
)

// BenchmarkIdleSessionHeap reports the edge's heap per idle agent session:
// each session has said hello, bound one HTTP endpoint and runs its
// heartbeats, and carries no traffic. The agents run in a child process
// (this test binary again, running TestIdleAgentsHelper) so that the
// parent's heap holds the edge alone. It also reports the goroutine stacks
// per session, which are not heap but cost memory too. It runs over a
// plaintext agent link and over TLS (Server.AgentTLS).
func BenchmarkIdleSessionHeap(b *testing.B) {
	const sessions = 1000
	for _, link := range []string{"plaintext", "tls"} {
		b.Run(link, func(b *testing.B) {
			var heap, inuse, stack, goroutines float64
			for range b.N {
				m := measureIdleSessions(b, &edge.Server{Domain: "example.test"}, sessions, link == "tls")
				heap += m.heapAlloc
				inuse += m.heapInuse
				stack += m.stackInuse
				goroutines += m.goroutines
			}
			n := float64(b.N) * sessions
			b.ReportMetric(0, "ns/op") // the time to open the sessions means nothing here
			b.ReportMetric(heap/n, "heap-B/session")
			b.ReportMetric(inuse/n, "heapinuse-B/session")
			b.ReportMetric(stack/n, "stack-B/session")
			b.ReportMetric(goroutines/n, "goroutines/session")
		})
	}
}

type memDelta struct {
	heapAlloc, heapInuse, stackInuse, goroutines float64
}

// measureIdleSessions opens sessions on srv from agent.Clients in a
// process of their own (TestIdleAgentsHelper), over TLS when overTLS, and
// returns what they added to this process: the edge's alone.
func measureIdleSessions(b testing.TB, srv *edge.Server, sessions int, overTLS bool) memDelta {
	var env []string
	if overTLS {
		ca := testpki.New(b)
		srv.AgentTLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(b, "127.0.0.1")}}
		caFile := filepath.Join(b.TempDir(), "ca.pem")
		if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
			b.Fatal(err)
		}
		env = append(env, idleCAEnv+"="+caFile)
	}
	ln := listen(b)
	served := make(chan struct{})
	go func() { defer close(served); srv.ServeAgents(ln) }()
	defer func() { srv.Close(); <-served }()

	before, g0 := memAfterGC()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleAgentsHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		idleEdgeEnv+"="+ln.Addr().String(),
		idleSessionsEnv+"="+strconv.Itoa(sessions))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	var out bytes.Buffer
	sc := bufio.NewScanner(stdout)
	ready := false
	for !ready && sc.Scan() {
		ready = sc.Text() == "ready"
		fmt.Fprintln(&out, sc.Text())
	}
	if !ready {
		b.Fatalf("agent process never got ready:\n%s", out.Bytes())
	}
	go io.Copy(io.Discard, stdout)
	after, g1 := memAfterGC()
	if f := os.Getenv("TUNNELKIT_BENCH_IDLE_HEAPPROFILE"); f != "" {
		// The heap while the sessions are open: where their memory is.
		w, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		pprof.Lookup("heap").WriteTo(w, 0)
		w.Close()
	}
	return memDelta{
		heapAlloc:  float64(after.HeapAlloc) - float64(before.HeapAlloc),
		heapInuse:  float64(after.HeapInuse) - float64(before.HeapInuse),
		stackInuse: float64(after.StackInuse) - float64(before.StackInuse),
		goroutines: float64(g1 - g0),
	}
}

func memAfterGC() (runtime.MemStats, int) {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m, runtime.NumGoroutine()
}

// TestIdleAgentsHelper is the agent process of BenchmarkIdleSessionHeap:
// it opens the sessions that its environment asks for, each binding one
// endpoint, prints "ready" and holds them until its stdin closes. In a
// normal test run it is skipped.
func TestIdleAgentsHelper(t *testing.T) {
	addr := os.Getenv(idleEdgeEnv)
	if addr == "" {
		t.Skip("the agent process of BenchmarkIdleSessionHeap")
	}
	n, err := strconv.Atoi(os.Getenv(idleSessionsEnv))
	if err != nil {
		t.Fatal(err)
	}
	var tlsConfig *tls.Config
	if f := os.Getenv(idleCAEnv); f != "" {
		caPEM, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caPEM) {
			t.Fatalf("no certificate in %s", f)
		}
		tlsConfig = &tls.Config{RootCAs: roots}
	}
	clients := make([]*agent.Client, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				c := &agent.Client{Addrs: []string{addr}, TLSConfig: tlsConfig}
				if _, err := c.Listen(context.Background(), "idle"+strconv.Itoa(i)); err != nil {
					t.Error(err)
					return
				}
				clients[i] = c
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range clients {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
}

// BenchmarkBindScaling reports what one bind costs on a session that holds
// 10,000 endpoints, as a ratio to a bind on an empty session, measured in
// one run. One op binds and unbinds one endpoint on each session.
//
//	go test ./edge -run '^$' -bench BindScaling -benchtime 2000x
func BenchmarkBindScaling(b *testing.B) {
	const held = 10_000
	srv := &edge.Server{Domain: "example.test", Limits: edge.Limits{EndpointsPerSession: -1}}
	agents := listen(b)
	go srv.ServeAgents(agents)
	b.Cleanup(func() { srv.Close() })
	empty := &agent.Client{Addrs: []string{agents.Addr().String()}}
	full := &agent.Client{Addrs: []string{agents.Addr().String()}}
	b.Cleanup(func() { empty.Close(); full.Close() })
	ctx := context.Background()
	if _, err := empty.Listen(ctx, "empty-session"); err != nil {
		b.Fatal(err)
	}
	for i := range held {
		if _, err := full.Listen(ctx, fmt.Sprintf("held-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	bindOnce := func(c *agent.Client, name string) time.Duration {
		start := time.Now()
		l, err := c.Listen(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		l.Close()
		return time.Since(start)
	}
	b.ResetTimer()
	var dEmpty, dFull time.Duration
	for i := range b.N {
		// Alternate which goes first, so that noise falls on both.
		if i%2 == 0 {
			dEmpty += bindOnce(empty, fmt.Sprintf("e%d", i))
			dFull += bindOnce(full, fmt.Sprintf("f%d", i))
		} else {
			dFull += bindOnce(full, fmt.Sprintf("f%d", i))
			dEmpty += bindOnce(empty, fmt.Sprintf("e%d", i))
		}
	}
	b.ReportMetric(float64(dEmpty.Microseconds())/float64(b.N), "us/bind-empty")
	b.ReportMetric(float64(dFull.Microseconds())/float64(b.N), "us/bind-10000")
	b.ReportMetric(dFull.Seconds()/dEmpty.Seconds(), "ratio")
}
