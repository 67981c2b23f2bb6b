package router

import "sync"

// RouteFeed delivers route changes to one RouteWatcher callback, in order,
// from a goroutine of its own, so that the callback never blocks the
// Router: a Router implementing RouteWatcher makes one per WatchRoutes
// call, with the routes it holds, and Pushes each change as it makes it
// (under its own lock, so that the order is its own). Changes wait in an
// unbounded queue for the callback.
type RouteFeed struct {
	f     func(Route, bool)
	mu    sync.Mutex
	queue []routeEvent
	wake  chan struct{} // buffered 1
	quit  chan struct{} // closed by Stop
	done  chan struct{} // closed when the goroutine returns
	once  sync.Once
}

type routeEvent struct {
	r     Route
	bound bool
}

// NewRouteFeed starts delivering to f: first initial, each as bound.
func NewRouteFeed(f func(r Route, bound bool), initial []Route) *RouteFeed {
	w := &RouteFeed{f: f, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	for _, r := range initial {
		w.queue = append(w.queue, routeEvent{r, true})
	}
	w.signal()
	go w.run()
	return w
}

// Push queues a change for the callback.
func (w *RouteFeed) Push(r Route, bound bool) {
	w.mu.Lock()
	w.queue = append(w.queue, routeEvent{r, bound})
	w.mu.Unlock()
	w.signal()
}

// Stop ends the feed and waits for a call of the callback in progress to
// return, so that it is never called after Stop returns: the callback must
// not call Stop itself. Calling Stop again does nothing.
func (w *RouteFeed) Stop() {
	w.once.Do(func() { close(w.quit) })
	<-w.done
}

func (w *RouteFeed) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *RouteFeed) run() {
	defer close(w.done)
	for {
		select {
		case <-w.quit:
			return
		case <-w.wake:
		}
		w.mu.Lock()
		events := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, e := range events {
			select {
			case <-w.quit:
				return
			default:
			}
			w.f(e.r, e.bound)
		}
	}
}
