package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tunnelkit/tunnelkit/edge"
)

// Edge counts what an edge.Server tells its Observer, as the metrics
// tunnelkit_edge_* (see the package documentation). Set it as the
// Server's Observer and register it on a prometheus.Registerer. Make one
// with NewEdge; its zero value is not usable. Its methods are safe for
// concurrent use.
type Edge struct {
	sessions  prometheus.Gauge
	streams   prometheus.Gauge
	endpoints *prometheus.GaugeVec
	conns     *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	refused   *prometheus.CounterVec
	down      *prometheus.GaugeVec

	// The children for the known label values, indexed by protoIndex,
	// classIndex and reason.
	endpointsBy [nProtos]prometheus.Gauge
	downBy      [nProtos]prometheus.Gauge
	connsBy     [nProtos]prometheus.Counter
	inBy, outBy [nProtos]prometheus.Counter
	requestsBy  [nHTTPProtos][len(classes)]prometheus.Counter
	durationBy  [nHTTPProtos]prometheus.Observer
	refusedBy   map[edge.Reason]prometheus.Counter
}

// nHTTPProtos: HTTP requests are "http" or "https", the first two protos.
const nHTTPProtos = 2

// Edge is a prometheus.Collector, and an edge.Observer: the test asserts
// that, so that a program that imports this package for an Agent alone
// does not link package edge.
var _ prometheus.Collector = (*Edge)(nil)

// durationBuckets are the upper bounds, in seconds, of the request
// duration histogram: from a millisecond (an app on the agent's machine
// answering at once) to a minute (a long poll).
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// NewEdge returns an Edge whose metrics are all zero.
func NewEdge() *Edge {
	m := &Edge{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tunnelkit_edge_sessions",
			Help: "Agent sessions open on the edge (their hello accepted).",
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tunnelkit_edge_streams",
			Help: "Streams open to and from agents.",
		}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tunnelkit_edge_endpoints",
			Help: "Endpoints bound by agents, by protocol.",
		}, []string{"proto"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tunnelkit_edge_connections_total",
			Help: "Public connections accepted, by protocol.",
		}, []string{"proto"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tunnelkit_edge_bytes_total",
			Help: "Bytes from public clients towards agents (direction in) and back (out), by protocol; for HTTP, the bodies.",
		}, []string{"proto", "direction"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tunnelkit_edge_http_requests_total",
			Help: "HTTP requests routed, by protocol and status class.",
		}, []string{"proto", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tunnelkit_edge_http_request_duration_seconds",
			Help:    "Time from an HTTP request's arrival to the end of its response, by protocol.",
			Buckets: durationBuckets,
		}, []string{"proto"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tunnelkit_edge_refused_total",
			Help: "Agents, connections and requests the edge refused, by reason.",
		}, []string{"reason"}),
		down: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tunnelkit_edge_endpoints_down",
			Help: "Endpoints whose app is down, as their agent's health check says (nothing is routed to them), by protocol.",
		}, []string{"proto"}),
		refusedBy: map[edge.Reason]prometheus.Counter{},
	}
	for i, p := range protos {
		m.endpointsBy[i] = m.endpoints.WithLabelValues(p)
		m.downBy[i] = m.down.WithLabelValues(p)
		m.connsBy[i] = m.conns.WithLabelValues(p)
		m.inBy[i] = m.bytes.WithLabelValues(p, "in")
		m.outBy[i] = m.bytes.WithLabelValues(p, "out")
	}
	for i, p := range protos[:nHTTPProtos] {
		for j, c := range classes {
			m.requestsBy[i][j] = m.requests.WithLabelValues(p, c)
		}
		m.durationBy[i] = m.duration.WithLabelValues(p)
	}
	for _, r := range edge.Reasons() {
		m.refusedBy[r] = m.refused.WithLabelValues(string(r))
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Edge) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Edge) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Edge) collectors() [9]prometheus.Collector {
	return [...]prometheus.Collector{m.sessions, m.endpoints, m.down, m.streams, m.conns, m.bytes, m.requests, m.duration, m.refused}
}

// Session implements edge.Observer.
func (m *Edge) Session(delta int) { m.sessions.Add(float64(delta)) }

// Endpoint implements edge.Observer.
func (m *Edge) Endpoint(proto string, delta int) {
	if i := protoIndex(proto); i >= 0 {
		m.endpointsBy[i].Add(float64(delta))
		return
	}
	m.endpoints.WithLabelValues(other).Add(float64(delta))
}

// EndpointDown implements edge.HealthObserver.
func (m *Edge) EndpointDown(proto string, down bool) {
	d := -1.0
	if down {
		d = 1
	}
	if i := protoIndex(proto); i >= 0 {
		m.downBy[i].Add(d)
		return
	}
	m.down.WithLabelValues(other).Add(d)
}

// Stream implements edge.Observer.
func (m *Edge) Stream(delta int) { m.streams.Add(float64(delta)) }

// Conn implements edge.Observer.
func (m *Edge) Conn(proto string) {
	if i := protoIndex(proto); i >= 0 {
		m.connsBy[i].Inc()
		return
	}
	m.conns.WithLabelValues(other).Inc()
}

// Bytes implements edge.Observer.
func (m *Edge) Bytes(proto string, in, out int64) {
	if i := protoIndex(proto); i >= 0 {
		addBytes(m.inBy[i], in)
		addBytes(m.outBy[i], out)
		return
	}
	addBytes(m.bytes.WithLabelValues(other, "in"), in)
	addBytes(m.bytes.WithLabelValues(other, "out"), out)
}

// Request implements edge.Observer. A status outside 100-599 (0: no
// response was sent) is counted with code "other".
func (m *Edge) Request(proto string, status int, d time.Duration) {
	p, c := protoIndex(proto), classIndex(status)
	if p >= 0 && p < nHTTPProtos && c >= 0 {
		m.requestsBy[p][c].Inc()
		m.durationBy[p].Observe(d.Seconds())
		return
	}
	label := other
	if p >= 0 {
		label = protos[p]
	}
	code := other
	if c >= 0 {
		code = classes[c]
	}
	m.requests.WithLabelValues(label, code).Inc()
	m.duration.WithLabelValues(label).Observe(d.Seconds())
}

// Refused implements edge.Observer.
func (m *Edge) Refused(reason edge.Reason) {
	if c, ok := m.refusedBy[reason]; ok {
		c.Inc()
		return
	}
	m.refused.WithLabelValues(other).Inc()
}

// addBytes adds n to c; a counter never goes down, so a negative n is
// dropped.
func addBytes(c prometheus.Counter, n int64) {
	if n > 0 {
		c.Add(float64(n))
	}
}
