package main

// The well-behaved client: keep-alive GETs and small POSTs to the app, and
// a TCP echo every 200 ms, all from 203.0.113.5. Every failure counts.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// latencies is a set of measured durations.
type latencies struct {
	mu      sync.Mutex
	d       []time.Duration
	slowest []slow // the slowest few, slowest first
}

// slow is one slow exchange, and when it started.
type slow struct {
	d     time.Duration
	start time.Time
	what  string
}

func (l *latencies) add(d time.Duration, start time.Time, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.d = append(l.d, d)
	if len(l.slowest) < 3 || d > l.slowest[len(l.slowest)-1].d {
		l.slowest = append(l.slowest, slow{d, start, what})
		slices.SortFunc(l.slowest, func(a, b slow) int { return int(b.d - a.d) })
		l.slowest = l.slowest[:min(len(l.slowest), 3)]
	}
}

// summary is what a set of latencies comes to.
type summary struct {
	N             int
	P50, P99, Max time.Duration
	Slowest       []string // the slowest few, with when they started
}

func (l *latencies) summary() summary {
	l.mu.Lock()
	d := slices.Clone(l.d)
	l.mu.Unlock()
	if len(d) == 0 {
		return summary{}
	}
	slices.Sort(d)
	rank := func(p float64) time.Duration { // nearest rank
		i := int(p*float64(len(d))+0.999999) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	s := summary{N: len(d), P50: rank(0.50), P99: rank(0.99), Max: d[len(d)-1]}
	l.mu.Lock()
	for _, e := range l.slowest {
		s.Slowest = append(s.Slowest, fmt.Sprintf("%s %s %s", e.start.Format("15:04:05.000"), e.what, ms(e.d)))
	}
	l.mu.Unlock()
	return s
}

// goodResult is what the well-behaved client saw in one phase.
type goodResult struct {
	HTTP, TCP summary
	Failures  []string // reason, count, most frequent first
	NFailed   int
	First     []string // the first failures, with their time
}

// failures records the well-behaved client's failures.
type failures struct {
	mu    sync.Mutex
	by    map[string]int
	n     int
	first []string
}

func (f *failures) add(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[string]int{}
	}
	f.by[what]++
	f.n++
	if len(f.first) < 10 {
		f.first = append(f.first, time.Now().Format("15:04:05.000")+" "+what)
	}
}

// runGood runs the well-behaved client for d against the edge's HTTP
// address and the TCP endpoint at tcpAddr.
func runGood(ctx context.Context, cfg *config, httpAddr, tcpAddr string) goodResult {
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	src := newSource(goodAddr)
	var httpLat, tcpLat latencies
	var fails failures
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		wg.Go(func() { goodWorker(ctx, w, cfg.Pace, httpAddr, src, &httpLat, &fails) })
	}
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		var probes sync.WaitGroup
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				probes.Wait()
				return
			case <-t.C:
			}
			probes.Go(func() { tcpProbe(ctx, i, tcpAddr, src, &tcpLat, &fails) })
		}
	})
	wg.Wait()

	res := goodResult{HTTP: httpLat.summary(), TCP: tcpLat.summary()}
	fails.mu.Lock()
	res.NFailed, res.First = fails.n, fails.first
	for k, n := range fails.by {
		res.Failures = append(res.Failures, fmt.Sprintf("%d %s", n, k))
	}
	fails.mu.Unlock()
	slices.SortFunc(res.Failures, func(a, b string) int {
		var na, nb int
		fmt.Sscan(a, &na)
		fmt.Sscan(b, &nb)
		return nb - na
	})
	return res
}

// goodWorker alternates GETs and small POSTs on one keep-alive connection
// (a new one when the edge closes it), one every pace, until ctx is done.
func goodWorker(ctx context.Context, w int, pace time.Duration, httpAddr string, src *source, lat *latencies, fails *failures) {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dialAs(ctx, httpAddr, src.next()) },
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	next := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		if pace > 0 {
			// The next start, never bunched up to catch up after a slow one.
			next = next.Add(pace)
			if now := time.Now(); next.Before(now) {
				next = now
			}
			if !sleep(ctx, time.Until(next)) {
				return
			}
		}
		method, body, want := http.MethodGet, "", "ok\n"
		if i%2 == 1 {
			method = http.MethodPost
			body = fmt.Sprintf("worker %d request %d: %s\n", w, i, strings.Repeat("x", 64+i%64))
			want = body
		}
		// The request is not tied to ctx: one cut by the phase's end would
		// look like a failure.
		req, _ := http.NewRequest(method, "http://"+appHost+"/", strings.NewReader(body))
		if method == http.MethodGet {
			req.Body = nil
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			fails.add(method + ": " + reason(err))
			continue
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		elapsed := time.Since(start)
		switch {
		case err != nil:
			fails.add(method + ": body: " + reason(err))
		case resp.StatusCode != http.StatusOK:
			fails.add(fmt.Sprintf("%s: status %d %s %q", method, resp.StatusCode, resp.Header.Get("Tunnelkit-Error"), trim(got, 60)))
		case string(got) != want:
			fails.add(fmt.Sprintf("%s: wrong body %q", method, trim(got, 40)))
		default:
			lat.add(elapsed, start, method)
		}
	}
}

// tcpProbe opens a connection to the TCP endpoint, sends a line and reads
// its echo.
func tcpProbe(ctx context.Context, i int, tcpAddr string, src *source, lat *latencies, fails *failures) {
	start := time.Now()
	c, err := dialAs(context.WithoutCancel(ctx), tcpAddr, src.next())
	if err != nil {
		fails.add("TCP: dial: " + reason(err))
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line := fmt.Sprintf("probe %d\n", i)
	if _, err := io.WriteString(c, line); err != nil {
		fails.add("TCP: write: " + reason(err))
		return
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	switch {
	case err != nil:
		fails.add("TCP: read echo: " + reason(err))
	case got != line:
		fails.add(fmt.Sprintf("TCP: wrong echo %q", trim([]byte(got), 40)))
	default:
		lat.add(time.Since(start), start, "TCP")
	}
}

func trim(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
