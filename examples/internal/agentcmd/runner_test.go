package agentcmd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

// TestHandOverAfterTheEndpointWasLost: once an endpoint's listener failed
// for good, a reload's change of the endpoint starts no forwarder that
// nothing would end: the endpoint is reported lost, once, and stopping it
// returns.
func TestHandOverAfterTheEndpointWasLost(t *testing.T) {
	agents, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &edge.Server{Domain: "example.test"}
	go srv.ServeAgents(agents)
	defer srv.Close()
	c := &agent.Client{Addrs: []string{agents.Addr().String()}}
	defer c.Close()

	var mu sync.Mutex
	var lost []error
	r := &runner{c: c, log: slog.New(slog.DiscardHandler), stdout: io.Discard, failed: func(err error) {
		mu.Lock()
		lost = append(lost, err)
		mu.Unlock()
	}}
	s := endpointSpec{URL: "http://lost", To: "127.0.0.1:1", where: "test"}
	if err := s.check(nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.start(ctx, s); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	run := r.running[s.key()]
	r.mu.Unlock()

	run.l.Close() // the listener fails, not stopped by the runner
	<-run.done
	r.mu.Lock()
	cur := run.cur
	r.mu.Unlock()
	r.handOver(run, s, false)
	r.mu.Lock()
	after := run.cur
	r.mu.Unlock()
	if after != cur {
		t.Error("a forwarder was started for an endpoint whose listener failed for good")
	}
	stopped := make(chan struct{})
	go func() { r.stop(s.key()); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute): // a hang, not a slow machine
		t.Fatal("stop did not return")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 1 || !errors.Is(lost[0], net.ErrClosed) {
		t.Errorf("reported lost: %v, want once, with the listener's error", lost)
	}
}
