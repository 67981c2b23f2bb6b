package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tunnelkit/tunnelkit/agent"
)

// Agent counts what an agent.Client tells its Observer and its OnEvent,
// as the metrics tunnelkit_agent_* (see the package documentation). Set it
// as one Client's Observer and its Event method as the same Client's
// OnEvent (agent.Client{Observer: m, OnEvent: m.Event}; an OnEvent of
// your own calls m.Event too), and register it on a
// prometheus.Registerer. Make one with NewAgent; its zero value is not
// usable. Its methods are safe for concurrent use.
type Agent struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter
	conns      *prometheus.CounterVec
	bytes      *prometheus.CounterVec

	// The children for the known protocols, indexed by protoIndex.
	connsBy     [nProtos]prometheus.Counter
	inBy, outBy [nProtos]prometheus.Counter
}

var (
	_ agent.Observer       = (*Agent)(nil)
	_ prometheus.Collector = (*Agent)(nil)
)

// NewAgent returns an Agent whose metrics are all zero.
func NewAgent() *Agent {
	m := &Agent{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tunnelkit_agent_connected",
			Help: "1 while the agent holds a session to an edge, else 0.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tunnelkit_agent_reconnects_total",
			Help: "Reconnection attempts: to open a session to an edge again after one ended, to bind endpoints the edge could not grant yet, or, while Listen waits for its edge, to open the first session.",
		}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tunnelkit_agent_connections_total",
			Help: "Public connections that reached the agent's listeners, by protocol.",
		}, []string{"proto"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tunnelkit_agent_bytes_total",
			Help: "Bytes of public connections read from the client (direction in) and written to it (out), by protocol; counted when each connection closes.",
		}, []string{"proto", "direction"}),
	}
	for i, p := range protos {
		m.connsBy[i] = m.conns.WithLabelValues(p)
		m.inBy[i] = m.bytes.WithLabelValues(p, "in")
		m.outBy[i] = m.bytes.WithLabelValues(p, "out")
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Agent) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Agent) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Agent) collectors() [4]prometheus.Collector {
	return [...]prometheus.Collector{m.connected, m.reconnects, m.conns, m.bytes}
}

// Event is a Client's OnEvent: Connected sets the connected gauge to 1,
// Disconnected to 0 (a Client's Close ends with one), and each
// Reconnecting counts one reconnect.
func (m *Agent) Event(e agent.Event) {
	switch e.Kind {
	case agent.Connected:
		m.connected.Set(1)
	case agent.Disconnected:
		m.connected.Set(0)
	case agent.Reconnecting:
		m.reconnects.Inc()
	}
}

// Conn implements agent.Observer.
func (m *Agent) Conn(proto string) {
	if i := protoIndex(proto); i >= 0 {
		m.connsBy[i].Inc()
		return
	}
	m.conns.WithLabelValues(other).Inc()
}

// Bytes implements agent.Observer.
func (m *Agent) Bytes(proto string, in, out int64) {
	if i := protoIndex(proto); i >= 0 {
		addBytes(m.inBy[i], in)
		addBytes(m.outBy[i], out)
		return
	}
	addBytes(m.bytes.WithLabelValues(other, "in"), in)
	addBytes(m.bytes.WithLabelValues(other, "out"), out)
}
