// Package drain keeps what an edge's drain waits for (edge.Server.Drain):
// the sessions whose agents it asked to move, until each says it moved or
// ends, and the notice it gives load balancers.
package drain

import (
	"context"
	"sync"
	"time"
)

// Moves is the sessions, by key, whose agents were asked to move and have
// not moved yet. Its zero value is empty and ready to use; it is safe for
// concurrent use.
type Moves[K comparable] struct {
	mu      sync.Mutex
	waiting map[K]struct{}
	wake    chan struct{} // closed when one goes; nil while nobody waits
}

// Ask adds k to the sessions waited for.
func (m *Moves[K]) Ask(k K) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waiting == nil {
		m.waiting = map[K]struct{}{}
	}
	m.waiting[k] = struct{}{}
}

// Done removes k: its agent moved, or its session ended. Removing a key
// not asked is harmless.
func (m *Moves[K]) Done(k K) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.waiting[k]; !ok {
		return
	}
	delete(m.waiting, k)
	if m.wake != nil {
		close(m.wake)
		m.wake = nil
	}
}

// Wait waits until no session is left, limit has passed (zero or
// negative: no limit) or ctx is done, and returns how many are left.
func (m *Moves[K]) Wait(ctx context.Context, limit time.Duration) int {
	var timeout chan struct{}
	if limit > 0 {
		timeout = make(chan struct{})
		t := time.AfterFunc(limit, func() { close(timeout) })
		defer t.Stop()
	}
	return m.WaitBelow(ctx, 1, timeout)
}

// WaitBelow waits until fewer than n sessions are left, timeout is closed
// (nil: never) or ctx is done, and returns how many are left: how a
// draining edge keeps at most n agents moving at once. A closed timeout
// serves any number of calls.
func (m *Moves[K]) WaitBelow(ctx context.Context, n int, timeout <-chan struct{}) int {
	for {
		m.mu.Lock()
		left := len(m.waiting)
		if m.wake == nil {
			m.wake = make(chan struct{})
		}
		wake := m.wake
		m.mu.Unlock()
		if left < n {
			return left
		}
		select {
		case <-wake:
		case <-timeout:
			return left
		case <-ctx.Done():
			return left
		}
	}
}

// Notice waits until d has passed since start, or ctx is done: how long a
// draining edge goes on taking connections after it reports itself
// draining, for load balancers to notice.
func Notice(ctx context.Context, start time.Time, d time.Duration) {
	wait := d - time.Since(start)
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Until waits until done reports true, looking every 10 ms, or until ctx
// is done, and then returns ctx's error: how a stopping edge lets the
// connections in flight end.
func Until(ctx context.Context, done func() bool) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
