package metrics_test

// Benchmarks of what counting costs. The one to quote is
// BenchmarkHTTPMetrics: HTTP requests through an edge and an agent with
// the Edge and Agent observers set against the same without them, in one
// run, interleaved. Run it with, for example:
//
//	go test ./metrics -run '^$' -bench HTTPMetrics -benchtime 20000x -count 5

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/benchload"
	"github.com/tunnelkit/tunnelkit/metrics"
)

// benchWorkers is the number of concurrent clients, each with its own
// keep-alive connection, as in the edge's HTTP benchmarks.
const benchWorkers = 8

const benchBody = "hello"

var helloHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte(benchBody))
})

// benchTarget is a URL served through an edge and an agent, with a
// keep-alive client whose connections all go to the edge.
type benchTarget struct {
	url    string
	client *http.Client
}

// startTunnelTarget serves helloHandler through an edge and an agent
// session on loopback; observed sets an Edge and an Agent, registered on
// a registry, as their Observers.
func startTunnelTarget(tb testing.TB, observed bool) benchTarget {
	tb.Helper()
	agents, pub := listen(tb), listen(tb)
	_, port, _ := net.SplitHostPort(pub.Addr().String())
	srv := &edge.Server{Domain: "example.test", HTTPPort: port}
	c := &agent.Client{Addrs: []string{agents.Addr().String()}}
	if observed {
		em, am := metrics.NewEdge(), metrics.NewAgent()
		prometheus.NewRegistry().MustRegister(em, am)
		srv.Observer, c.Observer, c.OnEvent = em, am, am.Event
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(pub) })
	l, err := c.Listen(context.Background(), "http://bench")
	if err != nil {
		tb.Fatal(err)
	}
	app := &http.Server{Handler: helloHandler}
	wg.Go(func() { app.Serve(l) })
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, pub.Addr().String())
		},
		MaxIdleConns:        4 * benchWorkers,
		MaxIdleConnsPerHost: 4 * benchWorkers,
		DisableCompression:  true,
	}
	tb.Cleanup(func() {
		tr.CloseIdleConnections()
		c.Close()
		app.Close()
		srv.Close()
		wg.Wait()
	})
	return benchTarget{url: l.URL() + "/", client: &http.Client{Transport: tr, Timeout: time.Minute}}
}

// load sends n GET requests to t from workers concurrent clients and
// returns the time they took (see benchload.Load).
func load(tb testing.TB, t benchTarget, n, workers int) time.Duration {
	return benchload.Load(tb, benchload.Target{URL: t.url, Client: t.client, Body: benchBody}, n, workers)
}

// BenchmarkHTTPMetrics reports the req/s of HTTP requests through an edge
// and an agent with metrics (an Edge and an Agent as their Observers) and
// without, measured in one run in short interleaved rounds, from
// benchWorkers keep-alive clients (throughput) and from one (latency
// bound), and the ratios of the two, with metrics over without: above
// 0.95 meets the target of less than 5% overhead. One op is one request on
// each path.
func BenchmarkHTTPMetrics(b *testing.B) {
	off := startTunnelTarget(b, false)
	on := startTunnelTarget(b, true)
	load(b, off, 50*benchWorkers, benchWorkers) // open every connection
	load(b, on, 50*benchWorkers, benchWorkers)
	for _, workers := range []int{benchWorkers, 1} {
		b.Run(fmt.Sprintf("conns=%d", workers), func(b *testing.B) {
			benchmarkRatio(b, off, on, workers)
		})
	}
}

// benchmarkRatio runs b.N requests on each of off and on, in rounds of a
// few tens of milliseconds that alternate which goes first, so that noise
// from the rest of the machine falls on both alike. Besides the rates from
// the total times, it reports the median of the rounds' ratios, which a
// burst of noise in a few rounds does not move, and the ratio of the CPU
// time the process spent on each (where the OS tells it), which other
// processes on the machine disturb less than the elapsed time.
func benchmarkRatio(b *testing.B, off, on benchTarget, workers int) {
	const perRound = 200
	var dOff, dOn, cpuOff, cpuOn time.Duration
	var ratios []float64
	run := func(t benchTarget, n int, d, cpu *time.Duration) time.Duration {
		c := cpuTime()
		rd := load(b, t, n, workers)
		*cpu += cpuTime() - c
		*d += rd
		return rd
	}
	for done, r := 0, 0; done < b.N; r++ {
		n := min(perRound, b.N-done)
		var rOff, rOn time.Duration
		if r%2 == 0 {
			rOff = run(off, n, &dOff, &cpuOff)
			rOn = run(on, n, &dOn, &cpuOn)
		} else {
			rOn = run(on, n, &dOn, &cpuOn)
			rOff = run(off, n, &dOff, &cpuOff)
		}
		ratios = append(ratios, rOff.Seconds()/rOn.Seconds())
		done += n
	}
	offRate := float64(b.N) / dOff.Seconds()
	onRate := float64(b.N) / dOn.Seconds()
	b.ReportMetric(offRate, "off-req/s")
	b.ReportMetric(onRate, "on-req/s")
	b.ReportMetric(onRate/offRate, "ratio")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
	if cpuOn > 0 {
		b.ReportMetric(cpuOff.Seconds()/cpuOn.Seconds(), "cpu-ratio")
	}
}

// BenchmarkEdgeObserverRequest is what an Edge does for one HTTP request
// on a new stream: a connection, a stream opened and closed, the request
// and its bytes; from every CPU at once.
func BenchmarkEdgeObserverRequest(b *testing.B) {
	m := metrics.NewEdge()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			edgeRequest(m)
		}
	})
}

func edgeRequest(m *metrics.Edge) {
	m.Conn("http")
	m.Stream(1)
	m.Request("http", 200, 1500*time.Microsecond)
	m.Bytes("http", 0, 5)
	m.Stream(-1)
}

// BenchmarkAgentObserverConn is what an Agent does for one connection:
// the connection and its bytes; from every CPU at once.
func BenchmarkAgentObserverConn(b *testing.B) {
	m := metrics.NewAgent()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Conn("http")
			m.Bytes("http", 80, 120)
		}
	})
}

// TestObserversDoNotAllocate: counting a request, a connection, a refusal
// or a session event allocates nothing.
func TestObserversDoNotAllocate(t *testing.T) {
	e, a := metrics.NewEdge(), metrics.NewAgent()
	for name, f := range map[string]func(){
		"edge request": func() { edgeRequest(e) },
		"edge https":   func() { e.Request("https", 503, time.Second) },
		"edge tcp":     func() { e.Conn("tcp"); e.Bytes("tcp", 100, 200) },
		"edge refused": func() { e.Refused(edge.ReasonNoEndpoint) },
		"edge session": func() { e.Session(1); e.Endpoint("tls", 1); e.Endpoint("tls", -1); e.Session(-1) },
		"agent conn":   func() { a.Conn("tcp"); a.Bytes("tcp", 100, 200) },
		"agent event":  func() { a.Event(agent.Event{Kind: agent.Reconnecting}); a.Event(agent.Event{Kind: agent.Connected}) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %g allocations", name, n)
		}
	}
}
