//go:build unix

package edge_test

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
)

// BenchmarkPathRouting compares the CPU a request costs on a name with 50
// path prefixes (and the whole name) to one on a name without paths: the
// same request (GET /svc42/v0/users/123, which the name with paths routes
// to its /svc42/v0), through the same edge, to the same app, from
// benchWorkers keep-alive clients. It interleaves rounds of each, as
// BenchmarkHTTPRatio does, and measures the process's CPU time (user and
// system, getrusage) over each round: edge, agent, app and clients all
// run in the test process. One op is one request on each name. It
// reports the CPU per request of each, and paths/plain, which routing by
// path must keep within 1.05:
//
//	go test ./edge -run '^$' -bench PathRouting -benchtime 20000x -count 5
func BenchmarkPathRouting(b *testing.B) {
	te := startEdge(b)
	te.serveApp(b, "plain", helloHandler)
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	b.Cleanup(func() { c.Close() })
	serve := func(url string) {
		l, err := c.Listen(context.Background(), url)
		if err != nil {
			b.Fatal(err)
		}
		hs := &http.Server{Handler: helloHandler}
		go hs.Serve(l)
		b.Cleanup(func() { hs.Close() })
	}
	serve("http://paths")
	for i := range 50 {
		serve(fmt.Sprintf("http://paths/svc%d/v%d", i, i%3))
	}
	const target = "/svc42/v0/users/123"
	plain := benchTarget{url: te.url("plain") + target, client: benchClient(b, te.httpAddr)}
	paths := benchTarget{url: te.url("paths") + target, client: benchClient(b, te.httpAddr)}
	warm(b, plain)
	warm(b, paths)
	b.ResetTimer()
	const perRound = 200
	var cpuPlain, cpuPaths, wallPlain, wallPaths time.Duration
	round := func(t benchTarget, cpu, wall *time.Duration, n int) {
		before := cpuTime(b)
		*wall += load(b, t, n, benchWorkers)
		*cpu += cpuTime(b) - before
	}
	for done, r := 0, 0; done < b.N; r++ {
		n := min(perRound, b.N-done)
		if r%2 == 0 {
			round(plain, &cpuPlain, &wallPlain, n)
			round(paths, &cpuPaths, &wallPaths, n)
		} else {
			round(paths, &cpuPaths, &wallPaths, n)
			round(plain, &cpuPlain, &wallPlain, n)
		}
		done += n
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuPlain.Nanoseconds())/float64(b.N), "plain-cpu-ns/req")
	b.ReportMetric(float64(cpuPaths.Nanoseconds())/float64(b.N), "paths-cpu-ns/req")
	b.ReportMetric(float64(cpuPaths)/float64(cpuPlain), "cpu-ratio")
	b.ReportMetric(float64(b.N)/wallPlain.Seconds(), "plain-req/s")
	b.ReportMetric(float64(b.N)/wallPaths.Seconds(), "paths-req/s")
}

// cpuTime returns the CPU time the process used so far, user and system.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
