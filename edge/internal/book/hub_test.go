package book

import (
	"slices"
	"sync"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// A watcher gets every value, in order, while another watcher is stuck:
// Publish never waits for a watcher.
func TestHubOrderAndStuckWatcher(t *testing.T) {
	testwait.NoLeak(t, 0)
	var h Hub[int]
	release := make(chan struct{})
	stuckGot := make(chan int, 1000)
	stopStuck := h.Watch(func(v int) {
		<-release
		stuckGot <- v
	}, func(int) { t.Error("the stuck watcher lost values within its queue's bound") })
	var mu sync.Mutex
	var got []int
	stop := h.Watch(func(v int) { mu.Lock(); got = append(got, v); mu.Unlock() }, func(int) { t.Error("lost values") })
	for i := range 1000 {
		h.Publish(i) // returns while the stuck watcher holds its first value
	}
	want := make([]int, 1000)
	for i := range want {
		want[i] = i
	}
	testwait.For(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1000 })
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want 0 to 999 in order", got)
	}
	close(release)
	for i := range 1000 {
		if v := <-stuckGot; v != i {
			t.Fatalf("the stuck watcher's value %d is %d", i, v)
		}
	}
	stop()
	stop() // again: nothing
	stopStuck()
	h.Publish(1000) // nobody watches
	if h.Watched() {
		t.Fatal("Watched after every watcher stopped")
	}
}

// A watcher that falls Max values behind loses the values past them, and
// hears how many right after the values kept, before the next ones.
func TestHubLost(t *testing.T) {
	testwait.NoLeak(t, 0)
	h := Hub[int]{Max: 10}
	release := make(chan struct{})
	type got struct {
		v, lost int
	}
	ch := make(chan got, 100)
	first := true
	stop := h.Watch(func(v int) {
		if first {
			first = false
			<-release
		}
		ch <- got{v: v}
	}, func(n int) { ch <- got{lost: n} })
	defer stop()
	h.Publish(0)
	// Wait until the watcher holds value 0: its queue is empty then.
	testwait.For(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.queued() == 0 })
	for i := 1; i <= 25; i++ {
		h.Publish(i) // 1 to 10 are queued, 11 to 25 dropped
	}
	close(release)
	var seq []got
	for range 12 {
		seq = append(seq, <-ch)
	}
	h.Publish(26)
	seq = append(seq, <-ch)
	want := []got{{v: 0}}
	for i := 1; i <= 10; i++ {
		want = append(want, got{v: i})
	}
	want = append(want, got{lost: 15}, got{v: 26})
	if !slices.Equal(seq, want) {
		t.Fatalf("got %v, want %v", seq, want)
	}
}

// queued returns how many values wait in the watchers' queues; h.mu held.
func (h *Hub[T]) queued() int {
	n := 0
	for w := range h.watchers {
		n += w.Len()
	}
	return n
}

// Close delivers what is queued, then ends the watches; a Watch after it
// delivers nothing, and stop after Close does nothing harmful.
func TestHubClose(t *testing.T) {
	testwait.NoLeak(t, 0)
	var h Hub[int]
	release := make(chan struct{})
	var got []int
	stop := h.Watch(func(v int) {
		if v == 0 {
			<-release
		}
		got = append(got, v)
	}, func(int) {})
	for i := range 5 {
		h.Publish(i)
	}
	closed := make(chan struct{})
	go func() { h.Close(); close(closed) }()
	close(release)
	<-closed // Close waited for the watcher's goroutine
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("delivered before Close returned: %v, want 0 to 4", got)
	}
	stop()
	h.Close()
	stop2 := h.Watch(func(int) { t.Error("a watch after Close got a value") }, func(int) {})
	h.Publish(5)
	stop2()
}

// stop waits for a call of f under way, and f is not called after it.
func TestHubStopWaits(t *testing.T) {
	testwait.NoLeak(t, 0)
	var h Hub[int]
	in := make(chan struct{})
	release := make(chan struct{})
	var calls, after int
	stopped := false
	stop := h.Watch(func(v int) {
		calls++
		if stopped {
			after++
		}
		if v == 0 {
			close(in)
			<-release
		}
	}, func(int) {})
	h.Publish(0)
	h.Publish(1)
	<-in
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
		t.Fatal("stop returned while f was under way")
	default:
	}
	close(release)
	<-done
	stopped = true
	h.Publish(2)
	h.Close()
	if after != 0 || calls > 2 {
		t.Fatalf("f called %d times, %d after stop", calls, after)
	}
}
