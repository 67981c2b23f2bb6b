package etcdrouter

import (
	"sync"

	"github.com/tunnelkit/tunnelkit/router"
)

// WatchRoutes implements [router.RouteWatcher]: it calls f with every route
// in the cache (bound true), then with each route bound or unbound in the
// cluster afterwards, in the order the cache sees them, from one goroutine
// of its own (an [router.RouteFeed]). When the cache is loaded again (after
// its watch failed), f hears the differences. The changes wait in a queue
// for f, so a slow f delays nothing but its own watch.
//
// stop ends the watch and waits for a call of f in progress to return, so
// that f is never called after stop returns; f must therefore not call
// stop itself (it may start a goroutine that does). Calling stop again does
// nothing. Close ends every watch.
func (r *Router) WatchRoutes(f func(rt router.Route, bound bool)) (stop func()) {
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return func() {}
	}
	w := router.NewRouteFeed(f, r.allLocked())
	r.watchers[w] = struct{}{}
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.watchers, w)
			r.mu.Unlock()
		})
		w.Stop()
	}
}

// notifyLocked queues a change for every watcher.
func (r *Router) notifyLocked(rt router.Route, bound bool) {
	for w := range r.watchers {
		w.Push(rt, bound)
	}
}

// stopWatches ends every watch, once the Router is closed.
func (r *Router) stopWatches() {
	r.mu.Lock()
	ws := make([]*router.RouteFeed, 0, len(r.watchers))
	for w := range r.watchers {
		ws = append(ws, w)
	}
	r.watchers = map[*router.RouteFeed]struct{}{}
	r.mu.Unlock()
	for _, w := range ws {
		w.Stop()
	}
}
