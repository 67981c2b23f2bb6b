package agent

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// TestSessionEndedBeforeInstall: a session the edge closes right after it
// accepted the hello (Disconnect, a drain), whose end the client saw
// before it made the session its own, is not installed dead: Listen opens
// another and binds there. Before, the dead session stayed the client's
// for good, and every bind failed on it ("remote gone away", thousands of
// attempts in 10 s in TestDisconnectWhileBinding).
func TestSessionEndedBeforeInstall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &edge.Server{Domain: "example.test"}
	served := make(chan struct{})
	go func() { defer close(served); srv.ServeAgents(ln) }()
	t.Cleanup(func() { srv.Close(); <-served })

	// The first session's install waits until the session has ended and
	// the client has handled its end: the order a busy machine may give.
	ended := make(chan struct{})
	var endOnce, installOnce sync.Once
	onEnd := func(*wire.Session) { endOnce.Do(func() { close(ended) }) }
	onInstall := func(h *opened) {
		installOnce.Do(func() {
			h.mux.Close()
			<-ended
		})
	}
	testHookSessionEnded.Store(&onEnd)
	testHookInstall.Store(&onInstall)
	t.Cleanup(func() { testHookSessionEnded.Store(nil); testHookInstall.Store(nil) })

	c := &Client{Addrs: []string{ln.Addr().String()}, MinBackoff: 1, MaxBackoff: 2}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := c.Listen(ctx, "http://again")
	if err != nil {
		t.Fatalf("Listen after the first session ended as it opened: %v", err)
	}
	defer l.Close()
	// The edge sees the first session's end in its own time.
	testwait.For(t, func() bool { return len(srv.Sessions()) == 1 })
}
