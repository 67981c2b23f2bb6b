package agent

import (
	"net"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
)

// TestRenewsEndpointTickets: with tickets good for two seconds, the edge
// has the agent renew them every second; the listener's ticket is
// renewed, again and again (the timer is set anew after each renewal),
// and none are renewed once the client is closed.
func TestRenewsEndpointTickets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{TicketLifetime: 2 * time.Second}}
	served := make(chan struct{})
	go func() { defer close(served); srv.ServeAgents(ln) }()
	t.Cleanup(func() { srv.Close(); <-served })

	c := &Client{Addrs: []string{ln.Addr().String()}}
	l, err := c.Listen(t.Context(), "http://renewed")
	if err != nil {
		t.Fatal(err)
	}
	ticket := func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.bind.Ticket
	}
	seen := []string{ticket()}
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < 3 && time.Now().Before(deadline) {
		if tk := ticket(); tk != seen[len(seen)-1] {
			seen = append(seen, tk)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(seen) < 3 {
		t.Fatalf("the endpoint ticket was renewed %d times in 30 s, want 2", len(seen)-1)
	}
	c.Close()
	c.mu.Lock()
	stop := c.stopRenew
	c.mu.Unlock()
	if stop != nil {
		t.Error("renewals still set up after Close")
	}
}
