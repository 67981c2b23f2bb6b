// Package feed delivers values to a callback, in order, from a goroutine
// of the feed's own, so that whoever pushes them never waits for the
// callback: the route feeds of routers (router.RouteFeed) and the edge's
// event watchers (edge/internal/book) are each one.
package feed

import "sync"

// Feed queues the values Pushed to it and calls f with each, in order.
// With a bound (New's max), values past it are dropped and counted, and
// lost hears how many right after the values queued before them.
type Feed[T any] struct {
	f    func(T)
	lost func(n int)
	max  int

	wake chan struct{} // buffered 1
	quit chan struct{} // closed by Stop: end now
	done chan struct{} // closed when run returns
	once sync.Once

	mu       sync.Mutex
	queue    []T
	dropped  int  // values dropped since the queue was last taken
	finished bool // Finish: deliver what is queued, then end
}

// New starts delivering to f, first initial. max bounds the queue (0: no
// bound); lost, which may be nil without a bound, hears of the values
// dropped past it.
func New[T any](f func(T), lost func(n int), max int, initial ...T) *Feed[T] {
	q := &Feed[T]{f: f, lost: lost, max: max, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	q.queue = append(q.queue, initial...)
	q.signal()
	go q.run()
	return q
}

// Push queues v for the callback, or drops it when the queue is full.
func (q *Feed[T]) Push(v T) {
	q.mu.Lock()
	if q.max <= 0 || len(q.queue) < q.max {
		q.queue = append(q.queue, v)
	} else {
		q.dropped++
	}
	q.mu.Unlock()
	q.signal()
}

// Stop ends the feed now, dropping what is queued, and waits for a call
// of the callbacks under way, so that none comes after Stop returns: they
// must not call Stop. Calling it again does nothing.
func (q *Feed[T]) Stop() {
	q.once.Do(func() { close(q.quit) })
	<-q.done
}

// Finish has the feed deliver what is queued, then end; Done is closed
// once it has. It does not wait.
func (q *Feed[T]) Finish() {
	q.mu.Lock()
	q.finished = true
	q.mu.Unlock()
	q.signal()
}

// Len returns how many values wait for the callback.
func (q *Feed[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// Done is closed once the feed's goroutine has returned.
func (q *Feed[T]) Done() <-chan struct{} { return q.done }

func (q *Feed[T]) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *Feed[T]) run() {
	defer close(q.done)
	for {
		select {
		case <-q.quit:
			return
		case <-q.wake:
		}
		q.mu.Lock()
		queue, dropped, finished := q.queue, q.dropped, q.finished
		q.queue, q.dropped = nil, 0
		q.mu.Unlock()
		for _, v := range queue {
			select {
			case <-q.quit:
				return
			default:
			}
			q.f(v)
		}
		if dropped > 0 {
			q.lost(dropped)
		}
		if finished && len(queue) == 0 && dropped == 0 {
			return
		}
		if finished {
			q.signal() // look again: the queue may have grown meanwhile
		}
	}
}
