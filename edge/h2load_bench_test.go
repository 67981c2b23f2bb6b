package edge_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// BenchmarkH2LoadHTTPSRatio measures HTTPS with HTTP/2 through edge and
// agent against one stdlib TLS reverse-proxy hop, in the same run, with
// h2load (nghttp2-client): both front the same app on loopback, the
// tunnel through an https endpoint whose agent forwards to the app over
// TCP, the baseline through an http.Server with TLS and HTTP/2 and an
// httputil.ReverseProxy. It reports each one's requests per second and
// their ratio (tunnel/baseline; the target is at least 0.8), for the byte
// forwarder and for the agent's HTTP mode (a log line per request).
func BenchmarkH2LoadHTTPSRatio(b *testing.B) {
	testtools.Need(b, "h2load")
	app := listen(b)
	appSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello, world\n")
	})}
	go appSrv.Serve(app)
	b.Cleanup(func() { appSrv.Close() })

	// Baseline: one TLS reverse-proxy hop, HTTP/2 to clients, HTTP/1.1 to
	// the app.
	e := startHTTPSEdge(b, nil)
	baseLn := listen(b)
	target, _ := url.Parse("http://" + app.Addr().String())
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256}
	base := &http.Server{Handler: rp, TLSConfig: &tls.Config{Certificates: e.srv.Certificates}}
	go base.ServeTLS(baseLn, "", "")
	b.Cleanup(func() { base.Close() })

	modes := []struct {
		name  string
		serve func(l net.Listener, to string) error
	}{
		{"bytes", func(l net.Listener, to string) error { return forward.Bytes{To: to}.Serve(l) }},
		{"http", func(l net.Listener, to string) error { return forward.HTTP{To: to}.Serve(l) }},
	}
	urls := map[string]string{}
	for i, m := range modes {
		c := &agent.Client{Addrs: []string{e.agentAddr}}
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: fmt.Sprintf("https://bench%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); m.serve(l, app.Addr().String()) }()
		b.Cleanup(func() { c.Close(); <-done })
		urls[m.name] = l.URL()
	}
	_, basePort, _ := net.SplitHostPort(baseLn.Addr().String())
	baseURL := "https://base.example.test:" + basePort + "/"

	const n, clients, streams = 20000, 8, 16
	b.ResetTimer()
	for range b.N {
		baseRPS := h2load(b, baseURL, baseLn.Addr().String(), n, clients, streams)
		b.ReportMetric(baseRPS, "baseline-req/s")
		for _, m := range modes {
			rps := h2load(b, urls[m.name]+"/", e.tlsAddr, n, clients, streams)
			b.ReportMetric(rps, m.name+"-req/s")
			b.ReportMetric(rps/baseRPS, m.name+"-ratio")
		}
	}
}

var h2loadRate = regexp.MustCompile(`finished in [^,]+, ([0-9.]+) req/s`)
var h2loadDone = regexp.MustCompile(`requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded`)

// h2load runs h2load against url, connecting to addr, and returns its
// requests per second; every request must succeed.
func h2load(b *testing.B, url, addr string, n, clients, streams int) float64 {
	b.Helper()
	out, err := exec.Command("h2load", "-n", strconv.Itoa(n), "-c", strconv.Itoa(clients), "-m", strconv.Itoa(streams),
		"--connect-to="+addr, url).CombinedOutput()
	if err != nil {
		b.Fatalf("h2load %s: %v\n%s", url, err, out)
	}
	done := h2loadDone.FindSubmatch(out)
	if done == nil || string(done[1]) != string(done[2]) {
		b.Fatalf("h2load %s: not every request succeeded:\n%s", url, out)
	}
	rate := h2loadRate.FindSubmatch(out)
	if rate == nil {
		b.Fatalf("h2load %s: no rate in:\n%s", url, out)
	}
	rps, _ := strconv.ParseFloat(string(rate[1]), 64)
	return rps
}
