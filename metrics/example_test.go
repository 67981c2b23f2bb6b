package metrics_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log"
	"net"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/metrics"
)

func ExampleNewEdge() {
	m := metrics.NewEdge()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	srv := &edge.Server{Domain: "example.test", Observer: m}
	defer srv.Close()
	// Serve the metrics where Prometheus scrapes them, for example:
	//	go http.ListenAndServe("127.0.0.1:9100", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	// A request for a name no agent bound.
	srv.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "http://nobody.example.test/", nil))

	show(reg, "tunnelkit_edge_http_requests_total", "tunnelkit_edge_refused_total")
	// Output:
	// tunnelkit_edge_http_requests_total{code="4xx",proto="http"} 1
	// tunnelkit_edge_refused_total{reason="no_endpoint"} 1
}

func ExampleNewAgent() {
	// An edge on loopback, for the example.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &edge.Server{Domain: "example.test"}
	go srv.ServeAgents(ln)
	defer srv.Close()

	m := metrics.NewAgent()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	c := &agent.Client{Addrs: []string{ln.Addr().String()}, Observer: m, OnEvent: m.Event}
	defer c.Close()
	if _, err := c.Listen(context.Background(), "http://app"); err != nil {
		log.Fatal(err)
	}

	show(reg, "tunnelkit_agent_connected", "tunnelkit_agent_reconnects_total")
	// Output:
	// tunnelkit_agent_connected 1
	// tunnelkit_agent_reconnects_total 0
}

// show prints the series of the named metrics as a scrape of reg would,
// leaving out those at zero but for lone series (without labels).
func show(reg *prometheus.Registry, names ...string) {
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(bytes.NewReader(rec.Body.Bytes()))
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		labelled := strings.Contains(line, "{")
		for _, n := range names {
			if name == n && !(labelled && strings.HasSuffix(line, " 0")) {
				fmt.Println(line)
			}
		}
	}
}
