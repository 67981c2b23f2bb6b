package edge_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/policy"
)

// BenchmarkPolicyRatio reports what a traffic policy costs HTTP requests
// through the edge and an agent: the req/s of an endpoint with basic auth,
// an allow list and a deny list of 1,000 prefixes, and request and
// response headers, as a ratio to those of an endpoint without a policy on
// the same edge, measured in one run in short interleaved rounds (as
// BenchmarkHTTPRatio does), from benchWorkers keep-alive clients and from
// one. One op is one request to each endpoint. Both get the same
// requests, credentials included.
//
//	go test ./edge -run '^$' -bench PolicyRatio -benchtime 20000x -count 3
func BenchmarkPolicyRatio(b *testing.B) {
	te := startEdge(b)
	bindBench := func(name string, spec *policy.Spec) {
		c := &agent.Client{Addrs: []string{te.agentAddr}}
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://" + name, Policy: spec})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); http.Serve(l, helloHandler) }()
		b.Cleanup(func() { c.Close(); <-done })
	}
	var deny []netip.Prefix
	for i := range 1000 {
		deny = append(deny, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
	}
	bindBench("plain", nil)
	bindBench("guarded", &policy.Spec{
		CIDRAllow:       []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		CIDRDeny:        deny,
		BasicAuth:       &policy.BasicAuth{Credentials: []string{"ann:correct horse battery staple", "bob:hunter2"}},
		RequestHeaders:  &policy.Headers{Add: []string{"X-Env: prod"}, Remove: []string{"X-Debug"}},
		ResponseHeaders: &policy.Headers{Add: []string{"Strict-Transport-Security: max-age=63072000"}, Remove: []string{"Server"}},
	})
	_, port, _ := net.SplitHostPort(te.httpAddr)
	// The client sends the credentials of the URL with every request, to
	// both: the requests differ only in their host.
	const creds = "ann:correct%20horse%20battery%20staple@"
	plain := benchTarget{url: "http://" + creds + "plain.example.test:" + port + "/", client: benchClient(b, te.httpAddr)}
	guarded := benchTarget{url: "http://" + creds + "guarded.example.test:" + port + "/", client: benchClient(b, te.httpAddr)}
	warm(b, plain)
	warm(b, guarded)
	for _, workers := range []int{benchWorkers, 1} {
		b.Run(fmt.Sprintf("conns=%d", workers), func(b *testing.B) {
			const perRound = 200
			var dPlain, dGuarded time.Duration
			for done, r := 0, 0; done < b.N; r++ {
				n := min(perRound, b.N-done)
				if r%2 == 0 {
					dPlain += load(b, plain, n, workers)
					dGuarded += load(b, guarded, n, workers)
				} else {
					dGuarded += load(b, guarded, n, workers)
					dPlain += load(b, plain, n, workers)
				}
				done += n
			}
			plainRate, guardedRate := float64(b.N)/dPlain.Seconds(), float64(b.N)/dGuarded.Seconds()
			b.ReportMetric(plainRate, "nopolicy-req/s")
			b.ReportMetric(guardedRate, "policy-req/s")
			b.ReportMetric(guardedRate/plainRate, "ratio")
		})
	}
}
