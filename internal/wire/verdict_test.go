package wire_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

var errNoEndpoint, errUnreachable, errDown = errors.New("no endpoint"), errors.New("unreachable"), errors.New("down")

// TestVerdictReadyWhileReading: Ready and Err answer while a Read waits
// for the agent's reply, so that a writer gated on the verdict can still
// give up on its own timer; the channel closes once the reply is read.
func TestVerdictReadyWhileReading(t *testing.T) {
	agent, edge := net.Pipe()
	defer agent.Close()
	defer edge.Close()
	var v wire.Verdict
	read := make(chan error, 1)
	go func() { read <- v.Read(edge, errNoEndpoint, errUnreachable, errDown) }()

	answered := make(chan (<-chan struct{}), 1)
	go func() {
		if v.Err() != nil {
			t.Error("a verdict before any reply")
		}
		answered <- v.Ready()
	}()
	var ready <-chan struct{}
	select {
	case ready = <-answered:
	case <-time.After(30 * time.Second): // a deadlock, not a slow machine
		t.Fatal("Ready waited for the Read under way")
	}
	select {
	case <-ready:
		t.Fatal("ready before the reply")
	default:
	}
	if _, err := agent.Write(wire.AppendReply(nil, wire.Reply{Status: wire.ReplyAppUnreachable, Message: "refused"})); err != nil {
		t.Fatal(err)
	}
	<-ready
	if err := <-read; !errors.Is(err, errUnreachable) || !errors.Is(v.Err(), errUnreachable) {
		t.Fatalf("Read %v, Err %v; want unreachable", err, v.Err())
	}
	if err := v.Read(edge, errNoEndpoint, errUnreachable, errDown); !errors.Is(err, errUnreachable) {
		t.Fatalf("a second Read: %v, want the same verdict", err)
	}
}
