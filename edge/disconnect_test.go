package edge_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

// TestDisconnectSaysWhy: an agent whose identity the operator disconnects
// hears why before its session ends: its Disconnected event wraps
// agent.ErrEnded with the edge's words, rather than a closed connection.
func TestDisconnectSaysWhy(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{})
	events := make(chan agent.Event, 16)
	c := &agent.Client{Addrs: []string{te.agentAddr}, Token: "alice-token", MinBackoff: time.Hour, MaxBackoff: time.Hour,
		OnEvent: func(e agent.Event) { events <- e }}
	t.Cleanup(func() { c.Close() })
	bind(t, c, "http://shop")
	if n := te.srv.Disconnect("alice", true); n != 1 {
		t.Fatalf("Disconnect: %d sessions, want 1", n)
	}
	for e := range events {
		if e.Kind != agent.Disconnected {
			continue
		}
		if !errors.Is(e.Err, agent.ErrEnded) || !strings.Contains(e.Err.Error(), "disconnected by the edge's operator; its names are free") {
			t.Errorf("the Disconnected event's error: %v, want agent.ErrEnded with the edge's words", e.Err)
		}
		break
	}
}
