package router

import "github.com/tunnelkit/tunnelkit/internal/feed"

// RouteFeed delivers route changes to one RouteWatcher callback, in order,
// from a goroutine of its own, so that the callback never blocks the
// Router: a Router implementing RouteWatcher makes one per WatchRoutes
// call, with the routes it holds, and Pushes each change as it makes it
// (under its own lock, so that the order is its own). Changes wait in an
// unbounded queue for the callback.
type RouteFeed struct {
	q *feed.Feed[routeEvent]
}

type routeEvent struct {
	r     Route
	bound bool
}

// NewRouteFeed starts delivering to f: first initial, each as bound.
func NewRouteFeed(f func(r Route, bound bool), initial []Route) *RouteFeed {
	events := make([]routeEvent, len(initial))
	for i, r := range initial {
		events[i] = routeEvent{r, true}
	}
	return &RouteFeed{feed.New(func(e routeEvent) { f(e.r, e.bound) }, nil, 0, events...)}
}

// Push queues a change for the callback.
func (w *RouteFeed) Push(r Route, bound bool) { w.q.Push(routeEvent{r, bound}) }

// Stop ends the feed and waits for a call of the callback in progress to
// return, so that it is never called after Stop returns: the callback must
// not call Stop itself. Calling Stop again does nothing.
func (w *RouteFeed) Stop() { w.q.Stop() }
