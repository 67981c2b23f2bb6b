//go:build unix

package main

// The load generator: public requests at a steady rate to random names
// through random edges, as a load balancer in front of the edges sends
// them. It checks each edge's /healthz every 250 ms, as HAProxy does, and
// sends nothing to an edge that drains or is down; a request that got no
// answer (its connection could not be opened, or closed before a response
// came) is sent to another edge, as docs/cluster.md's HAProxy retries.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// balancer sends requests to the healthy edges.
type balancer struct {
	edges   []*edgeProc
	healthy []atomic.Bool
	clients []*http.Client
}

func newBalancer(edges []*edgeProc) *balancer {
	b := &balancer{edges: edges, healthy: make([]atomic.Bool, len(edges))}
	for _, e := range edges {
		addr := e.http
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					return nil, &dialError{err}
				}
				return c, nil
			},
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		}
		b.clients = append(b.clients, &http.Client{Transport: tr, Timeout: 10 * time.Second})
	}
	return b
}

// dialError is a connection to an edge that could not be opened.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// check asks each edge's /healthz now, and then every interval until ctx
// ends.
func (b *balancer) check(ctx context.Context, interval time.Duration) {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		var wg sync.WaitGroup
		for i, e := range b.edges {
			wg.Go(func() { b.healthy[i].Store(e.healthy(ctx, hc)) })
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// pick returns a random healthy edge not in tried, or -1.
func (b *balancer) pick(tried []int) int {
	var up []int
	for i := range b.edges {
		if b.healthy[i].Load() && !slices.Contains(tried, i) {
			up = append(up, i)
		}
	}
	if len(up) == 0 {
		return -1
	}
	return up[rand.IntN(len(up))]
}

// sample is one request's outcome.
type sample struct {
	name    int           // the agent whose endpoint it asked for
	at      time.Time     // when it was sent
	latency time.Duration // until its body was read
	err     string        // empty: it succeeded
}

// retries is how many times a request is sent again, each to another
// edge, as docs/cluster.md's HAProxy does (retries 3, retry-on
// conn-failure empty-response response-timeout): only where the edge
// answered nothing, so that no answer can have been sent twice.
const retries = 3

// do sends one request for agent name's endpoint.
func (b *balancer) do(ctx context.Context, name int) sample {
	s := sample{name: name, at: time.Now()}
	host := agentName(name) + "." + domain
	var tried []int
	for {
		i := b.pick(tried)
		if i < 0 {
			s.err = "no healthy edge"
			if len(tried) > 0 {
				s.err += " left to retry on"
			}
			break
		}
		tried = append(tried, i)
		answered, err := b.get(ctx, i, host)
		var de *dialError
		if errors.As(err, &de) {
			b.healthy[i].Store(false) // until its next check
		}
		if err != nil && !answered && len(tried) <= retries {
			continue
		}
		if err != nil {
			s.err = fmt.Sprintf("%s: %v", b.edges[i].name, err)
		}
		break
	}
	s.latency = time.Since(s.at)
	return s
}

// get asks edge i for host's / and checks that its app answered; answered
// tells whether the edge sent a response's header.
func (b *balancer) get(ctx context.Context, i int, host string) (answered bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.edges[i].http+"/", nil)
	if err != nil {
		return false, err
	}
	req.Host = host
	resp, err := b.clients[i].Do(req)
	if err != nil {
		return false, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if err != nil {
		return true, err
	}
	if resp.StatusCode != http.StatusOK {
		return true, fmt.Errorf("%s %s", resp.Status, resp.Header.Get("Tunnelkit-Error"))
	}
	if want, _, _ := strings.Cut(host, "."); string(body) != want {
		return true, fmt.Errorf("answered %q, want %q", body, want)
	}
	return true, nil
}

// loadRun sends rate requests a second, each for a random one of the
// first names agents, until stop is closed or ctx ends, and returns every
// request's outcome. Requests are sent on schedule whatever the answers
// take (an open loop), so that a slow answer delays no other request.
func (b *balancer) loadRun(ctx context.Context, rate, names int, stop <-chan struct{}) []sample {
	var (
		mu      sync.Mutex
		samples []sample
		wg      sync.WaitGroup
	)
	interval := time.Second / time.Duration(rate)
	next := time.Now()
loop:
	for {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			select {
			case <-stop:
				break loop
			case <-ctx.Done():
				break loop
			case <-time.After(d):
			}
		}
		name := rand.IntN(names)
		wg.Go(func() {
			s := b.do(ctx, name)
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
		})
	}
	wg.Wait()
	return samples
}

// start runs loadRun in the background until the func it returns is
// called, which returns every request's outcome.
func (b *balancer) start(ctx context.Context, rate, names int) (stop func() []sample) {
	done := make(chan struct{})
	result := make(chan []sample, 1)
	go func() { result <- b.loadRun(ctx, rate, names, done) }()
	return func() []sample {
		close(done)
		return <-result
	}
}

// load runs loadRun for d.
func (b *balancer) load(ctx context.Context, rate, names int, d time.Duration) []sample {
	stop := b.start(ctx, rate, names)
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return stop()
}

// latencyStats are the figures of a load.
type latencyStats struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
}

func stats(samples []sample) (latencyStats, []string) {
	st := latencyStats{Requests: len(samples)}
	var ms []float64
	var errs []string
	for _, s := range samples {
		if s.err != "" {
			st.Errors++
			if len(errs) < 5 {
				errs = append(errs, fmt.Sprintf("%s: %s", agentName(s.name), s.err))
			}
			continue
		}
		ms = append(ms, float64(s.latency)/float64(time.Millisecond))
	}
	st.P50Ms, st.P99Ms, st.MaxMs = percentile(ms, 50), percentile(ms, 99), percentile(ms, 100)
	return st, errs
}

// percentile returns the p-th percentile of xs (nearest rank), 0 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(k, 0), len(s)-1)]
}
