package book

import (
	"sync"
	"sync/atomic"

	"github.com/tunnelkit/tunnelkit/internal/feed"
)

// DefaultMax is how many values a watcher's queue holds when Hub.Max is
// zero.
const DefaultMax = 1 << 16

// Hub delivers the values Published to it to its watchers: each watcher's
// in the order published, from a goroutine of the watcher's own, so that
// a slow watcher delays nothing but its own values, and Publish never
// waits for one. A watcher's queue holds at most Max values; past it,
// values are dropped for that watcher and counted, and its lost func
// hears how many right after the values queued before them. Its zero
// value is ready to use. A Hub must not be copied after first use.
type Hub[T any] struct {
	// Max bounds each watcher's queue. Zero: DefaultMax.
	Max int

	n        atomic.Int32 // watchers
	mu       sync.Mutex   // orders Publish; guards the fields below
	watchers map[*feed.Feed[T]]struct{}
	closed   bool
}

// Watched reports whether the Hub has watchers: without, a publisher
// need not make a value. It takes no lock.
func (h *Hub[T]) Watched() bool { return h.n.Load() > 0 }

// Watch starts delivering each value published from now on to f, and
// n, the number of values dropped, to lost (see Hub). stop ends the
// delivery and waits for a call of f or lost under way, which must not
// call stop; calling it again does nothing. After Close, Watch delivers
// nothing.
func (h *Hub[T]) Watch(f func(T), lost func(n int)) (stop func()) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return func() {}
	}
	max := h.Max
	if max <= 0 {
		max = DefaultMax
	}
	w := feed.New(f, lost, max)
	if h.watchers == nil {
		h.watchers = map[*feed.Feed[T]]struct{}{}
	}
	h.watchers[w] = struct{}{}
	h.n.Add(1)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		if _, ok := h.watchers[w]; ok {
			delete(h.watchers, w)
			h.n.Add(-1)
		}
		h.mu.Unlock()
		w.Stop()
	}
}

// Publish queues v for every watcher.
func (h *Hub[T]) Publish(v T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		w.Push(v)
	}
}

// Close delivers to each watcher what is queued for it, then ends every
// watch, and waits for them. Only the first call does anything.
func (h *Hub[T]) Close() {
	h.mu.Lock()
	ws := h.watchers
	h.watchers, h.closed = nil, true
	h.n.Store(0)
	h.mu.Unlock()
	for w := range ws {
		w.Finish()
	}
	for w := range ws {
		<-w.Done()
	}
}
