package limits

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// TestSourceCountWaits: past its bound a source is refused at once, or
// waits for a slot when it has a deadline; a release wakes a waiter, two
// releases two of them; a waiter gives up at its deadline or when the
// server stops; other sources never wait; and the table forgets a source
// that holds and waits for nothing.
func TestSourceCountWaits(t *testing.T) {
	a, b := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/32")
	far := time.Now().Add(time.Hour)
	stop := make(chan struct{})
	h := &Count{Max: 2, Stop: stop}
	for i := range 2 {
		if !h.Acquire(a, far) {
			t.Fatalf("a source did not get slot %d of its bound of 2", i+1)
		}
	}
	if !h.Acquire(b, far) {
		t.Fatal("another source waited")
	}
	h.Release(b)

	// Past the bound, a count that may not wait (a listener's
	// connections) is refused at once, and a waiter gives up at its
	// deadline, holding nothing.
	if h.Acquire(a, time.Time{}) {
		t.Fatal("a source got a slot past its bound without waiting")
	}
	if h.Acquire(a, time.Now().Add(20*time.Millisecond)) {
		t.Fatal("a source got a slot past its bound")
	}

	// Two waiters, two releases: both get a slot.
	var wg sync.WaitGroup
	got := make(chan bool, 2)
	for range 2 {
		wg.Go(func() { got <- h.Acquire(a, far) })
	}
	testwait.For(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.by[a].waiters == 2 })
	h.Release(a)
	h.Release(a)
	wg.Wait()
	for range 2 {
		if !<-got {
			t.Fatal("a waiter did not get a freed slot")
		}
	}

	// The server stops: a waiter gives up.
	wg.Go(func() { got <- h.Acquire(a, far) })
	testwait.For(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.by[a].waiters == 1 })
	close(stop)
	wg.Wait()
	if <-got {
		t.Fatal("a waiter got a slot past the bound when the server stopped")
	}
	h.Release(a)
	h.Release(a)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.by) != 0 {
		t.Fatalf("the table keeps %d sources that hold nothing", len(h.by))
	}
}
