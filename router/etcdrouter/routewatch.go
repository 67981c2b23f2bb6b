package etcdrouter

import (
	"sync"

	"github.com/tunnelkit/tunnelkit/edge"
)

// watcher is a WatchRoutes call: the changes it has yet to deliver, and
// the goroutine delivering them.
type watcher struct {
	f     func(edge.Route, bool)
	mu    sync.Mutex
	queue []change
	wake  chan struct{} // buffered 1
	stop  chan struct{} // closed by the stop func
	done  chan struct{} // closed when its goroutine returns
}

// change is a route bound or unbound.
type change struct {
	route edge.Route
	bound bool
}

// WatchRoutes implements [edge.RouteWatcher]: it calls f with every route
// in the cache (bound true), then with each route bound or unbound in the
// cluster afterwards, in the order the cache sees them, from one goroutine
// of its own. When the cache is loaded again (after its watch failed), f
// hears the differences. The changes wait in a queue for f, so a slow f
// delays nothing but its own watch.
//
// stop ends the watch and waits for a call of f in progress to return, so
// that f is never called after stop returns; f must therefore not call
// stop itself (it may start a goroutine that does). Calling stop again does
// nothing. Close ends every watch.
func (r *Router) WatchRoutes(f func(rt edge.Route, bound bool)) (stop func()) {
	w := &watcher{
		f:    f,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		close(w.done)
		return func() {}
	}
	for _, rt := range r.allLocked() {
		w.queue = append(w.queue, change{rt, true})
	}
	w.wake <- struct{}{}
	r.watchers[w] = struct{}{}
	r.wg.Add(1) // under mu, which Close takes before it waits
	r.mu.Unlock()
	go r.deliver(w)
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.watchers, w)
			r.mu.Unlock()
			close(w.stop)
		})
		<-w.done
	}
}

// notifyLocked queues a change for every watcher.
func (r *Router) notifyLocked(rt edge.Route, bound bool) {
	for w := range r.watchers {
		w.mu.Lock()
		w.queue = append(w.queue, change{rt, bound})
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// deliver calls w.f with w's changes until w is stopped or the Router
// closed.
func (r *Router) deliver(w *watcher) {
	defer r.wg.Done()
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case <-r.ctx.Done():
			return
		case <-w.wake:
		}
		w.mu.Lock()
		batch := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, c := range batch {
			select {
			case <-w.stop:
				return
			case <-r.ctx.Done():
				return
			default:
			}
			w.f(c.route, c.bound)
		}
	}
}
