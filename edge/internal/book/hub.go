package book

import (
	"sync"
	"sync/atomic"
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
	watchers map[*watcher[T]]struct{}
	closed   bool
}

type watcher[T any] struct {
	f    func(T)
	lost func(n int)
	wake chan struct{} // buffered 1
	quit chan struct{} // closed by stop: end now
	done chan struct{} // closed when run returns
	once sync.Once

	mu      sync.Mutex
	queue   []T
	dropped int  // values dropped since the queue was last taken
	closing bool // the Hub closed: deliver what is queued, then end
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
	w := &watcher[T]{f: f, lost: lost, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return func() {}
	}
	if h.watchers == nil {
		h.watchers = map[*watcher[T]]struct{}{}
	}
	h.watchers[w] = struct{}{}
	h.n.Add(1)
	h.mu.Unlock()
	go w.run()
	return func() {
		h.mu.Lock()
		if _, ok := h.watchers[w]; ok {
			delete(h.watchers, w)
			h.n.Add(-1)
		}
		h.mu.Unlock()
		w.once.Do(func() { close(w.quit) })
		<-w.done
	}
}

// Publish queues v for every watcher.
func (h *Hub[T]) Publish(v T) {
	max := h.Max
	if max <= 0 {
		max = DefaultMax
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		w.mu.Lock()
		if len(w.queue) < max {
			w.queue = append(w.queue, v)
		} else {
			w.dropped++
		}
		w.mu.Unlock()
		w.signal()
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
		w.mu.Lock()
		w.closing = true
		w.mu.Unlock()
		w.signal()
	}
	for w := range ws {
		<-w.done
	}
}

func (w *watcher[T]) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run delivers the watcher's values until stop, or until the Hub closed
// and the queue is empty.
func (w *watcher[T]) run() {
	defer close(w.done)
	for {
		select {
		case <-w.quit:
			return
		case <-w.wake:
		}
		w.mu.Lock()
		queue, dropped, closing := w.queue, w.dropped, w.closing
		w.queue, w.dropped = nil, 0
		w.mu.Unlock()
		for _, v := range queue {
			select {
			case <-w.quit:
				return
			default:
			}
			w.f(v)
		}
		if dropped > 0 {
			w.lost(dropped)
		}
		if closing && len(queue) == 0 && dropped == 0 {
			return
		}
		if closing {
			w.signal() // look again: the queue may have grown meanwhile
		}
	}
}
