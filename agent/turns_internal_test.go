package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestHandshakeTurns: past the process's turns, a handshake waits in
// line within its attempt's time, fails with a clear error when that
// ends, and goes once a turn is given back. (Not parallel: the turns are
// the process's, and the other tests' Clients take them.)
func TestHandshakeTurns(t *testing.T) {
	var held []func()
	for range cap(handshakeTurns) {
		release, err := takeTurn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := takeTurn(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a handshake past the turns, its attempt over: %v, want context.DeadlineExceeded", err)
	}
	got := make(chan error)
	go func() {
		release, err := takeTurn(context.Background())
		if err == nil {
			release()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a handshake went while every turn was taken (%v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	held[0]()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	for _, release := range held[1:] {
		release()
	}
}
