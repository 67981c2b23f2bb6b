package drain

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Wait returns once every session asked is done, whatever the order of
// Ask, Done and Wait, and counts those left when its limit or context
// ends it first.
func TestMoves(t *testing.T) {
	t.Parallel()
	var m Moves[int]
	if n := m.Wait(context.Background(), 0); n != 0 {
		t.Fatalf("nothing asked: Wait = %d", n)
	}
	for i := range 100 {
		m.Ask(i)
	}
	m.Done(1000) // never asked
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() { m.Done(i); m.Done(i) })
	}
	if n := m.Wait(context.Background(), 0); n != 0 {
		t.Fatalf("all done: Wait = %d", n)
	}
	wg.Wait()

	m.Ask(1)
	m.Ask(2)
	m.Done(1)
	if n := m.Wait(context.Background(), time.Nanosecond); n != 1 {
		t.Errorf("one left at the limit: Wait = %d", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n := m.Wait(ctx, 0); n != 1 {
		t.Errorf("one left when ctx is done: Wait = %d", n)
	}
}

// Notice returns once d passed since start, or when ctx ends first.
func TestNotice(t *testing.T) {
	t.Parallel()
	start := time.Now()
	Notice(context.Background(), start, 10*time.Millisecond)
	if time.Since(start) < 10*time.Millisecond {
		t.Error("Notice returned before d passed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Notice(ctx, time.Now(), time.Hour) // returns: ctx is done
	Notice(context.Background(), start.Add(-time.Hour), time.Minute)
}

// Until returns nil once done holds, and ctx's error when it ends first.
func TestUntil(t *testing.T) {
	t.Parallel()
	n := 0
	if err := Until(context.Background(), func() bool { n++; return n > 3 }); err != nil || n != 4 {
		t.Errorf("Until = %v after %d looks, want nil after 4", err, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Until(ctx, func() bool { return false }); err != context.Canceled {
		t.Errorf("Until with ctx done = %v", err)
	}
}
