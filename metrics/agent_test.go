package metrics_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/metrics"
)

// plainEdge runs an edge with plain HTTP and TCP endpoints on loopback,
// taking agents on the given listener, until stop or cleanup.
type plainEdge struct {
	srv      *edge.Server
	httpAddr string
	wg       sync.WaitGroup
}

func startPlainEdge(t testing.TB, agents net.Listener) *plainEdge {
	t.Helper()
	pub := listen(t)
	_, port, _ := net.SplitHostPort(pub.Addr().String())
	e := &plainEdge{
		srv:      &edge.Server{Domain: "example.test", HTTPPort: port, TCPPorts: edge.PortRange{Min: 1024, Max: 65535}},
		httpAddr: pub.Addr().String(),
	}
	e.wg.Go(func() { e.srv.ServeAgents(agents) })
	e.wg.Go(func() { e.srv.ServeHTTPListener(pub) })
	t.Cleanup(e.stop)
	return e
}

// stop closes the edge and waits for it.
func (e *plainEdge) stop() {
	e.srv.Close()
	e.wg.Wait()
}

// notify sends ev on ch unless ch is full: OnEvent must not block.
func notify(ch chan<- agent.Event, ev agent.Event) {
	select {
	case ch <- ev:
	default:
	}
}

func waitEvent(t testing.TB, ch <-chan agent.Event, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s event after 20 s", what)
	}
}

// TestAgentMetrics runs an agent with HTTP and TCP endpoints through an
// edge, then stops the edge and starts another on the same address: the
// agent's metrics count its connections and bytes, show it connected, not
// connected while the edge is down, then connected again, and count its
// reconnection attempts.
func TestAgentMetrics(t *testing.T) {
	m := metrics.NewAgent()
	url := serveMetrics(t, m)
	agents := listen(t)
	agentAddr := agents.Addr().String()
	e := startPlainEdge(t, agents)

	connected := make(chan agent.Event, 16)
	disconnected := make(chan agent.Event, 16)
	c := &agent.Client{
		Addrs:      []string{agentAddr},
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond,
		Observer:   m,
		// The metrics hear of each event before the test does.
		OnEvent: func(ev agent.Event) {
			m.Event(ev)
			switch ev.Kind {
			case agent.Connected:
				notify(connected, ev)
			case agent.Disconnected:
				notify(disconnected, ev)
			}
		},
	}
	t.Cleanup(func() { c.Close() })
	waitMetrics(t, url, eq("tunnelkit_agent_connected", 0), eq("tunnelkit_agent_reconnects_total", 0))

	serveHTTP(t, c, "http://app", app)
	waitEvent(t, connected, "Connected")
	tcpL, err := c.Listen(context.Background(), "tcp://")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, tcpL, func(conn net.Conn) {
		defer conn.Close()
		io.ReadFull(conn, make([]byte, 5))
		io.WriteString(conn, "world!")
	})
	waitMetrics(t, url, eq("tunnelkit_agent_connected", 1), eq("tunnelkit_agent_reconnects_total", 0))

	// Two HTTP requests, each on a connection of its own, which the edge
	// carries on a stream of its own.
	plain := client(t, e.httpAddr, nil)
	for range 2 {
		if code := get(t, plain, "POST", "http://app.example.test/", "12345"); code != 200 {
			t.Fatalf("POST: %d", code)
		}
	}
	tcpConn, err := net.Dial("tcp", strings.TrimPrefix(tcpL.URL(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(tcpConn, "hello")
	if b, err := io.ReadAll(tcpConn); err != nil || string(b) != "world!" {
		t.Fatalf("tcp: %q, %v", b, err)
	}
	tcpConn.Close()
	waitMetrics(t, url,
		eq(`tunnelkit_agent_connections_total{proto="http"}`, 2),
		eq(`tunnelkit_agent_connections_total{proto="tcp"}`, 1),
		eq(`tunnelkit_agent_connections_total{proto="https"}`, 0),
		// Two requests of at least their body and "POST / HTTP/1.1\r\n",
		// two responses of at least theirs and "HTTP/1.1 200 OK\r\n".
		atLeast(`tunnelkit_agent_bytes_total{direction="in",proto="http"}`, 2*(5+17)),
		atLeast(`tunnelkit_agent_bytes_total{direction="out",proto="http"}`, 2*(5+17)),
		eq(`tunnelkit_agent_bytes_total{direction="in",proto="tcp"}`, 5),
		eq(`tunnelkit_agent_bytes_total{direction="out",proto="tcp"}`, 6),
	)

	// The edge goes: the agent is not connected, and tries again.
	e.stop()
	waitEvent(t, disconnected, "Disconnected")
	waitMetrics(t, url, eq("tunnelkit_agent_connected", 0), atLeast("tunnelkit_agent_reconnects_total", 1))

	// An edge comes back on the same address: the agent connects again.
	agents2, err := net.Listen("tcp", agentAddr)
	if err != nil {
		t.Fatal(err)
	}
	startPlainEdge(t, agents2)
	waitEvent(t, connected, "Connected")
	s := waitMetrics(t, url, eq("tunnelkit_agent_connected", 1), atLeast("tunnelkit_agent_reconnects_total", 1))
	t.Logf("reconnection attempts: %g", s["tunnelkit_agent_reconnects_total"])
}

// TestAgentUnknownLabels: a protocol outside the known set is counted
// under "other".
func TestAgentUnknownLabels(t *testing.T) {
	m := metrics.NewAgent()
	url := serveMetrics(t, m)
	m.Conn("quic")
	m.Bytes("quic", 3, 4)
	m.Bytes("tcp", -1, 2)
	m.Event(agent.Event{Kind: agent.EventKind(42)})
	waitMetrics(t, url,
		eq(`tunnelkit_agent_connections_total{proto="other"}`, 1),
		eq(`tunnelkit_agent_bytes_total{direction="in",proto="other"}`, 3),
		eq(`tunnelkit_agent_bytes_total{direction="out",proto="other"}`, 4),
		eq(`tunnelkit_agent_bytes_total{direction="in",proto="tcp"}`, 0),
		eq(`tunnelkit_agent_bytes_total{direction="out",proto="tcp"}`, 2),
		eq("tunnelkit_agent_connected", 0),
		eq("tunnelkit_agent_reconnects_total", 0),
	)
}
