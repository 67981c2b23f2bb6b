package limits

import (
	"container/list"
	"sync"
	"time"
)

// Turns bounds work done at once, and serves the work that waits in the
// order it came: an edge computes the keys of so many agents' TLS
// handshakes at once (Limits.Handshakes). When thousands of agents
// reconnect together, a bound served in turn has the first ones done in
// milliseconds, while with none every handshake shares the CPU with all
// the others, and all of them take longer than their agents wait.
// Its zero value bounds nothing until SetMax.
type Turns struct {
	mu      sync.Mutex
	max     int       // 0: no bound
	held    int       // turns taken and not given back
	waiters list.List // of chan struct{}, in the order they came
}

// SetMax changes the bound (zero or negative: none). Waiters that the new
// bound lets in go at once; turns held past a lower bound are held until
// given back.
func (t *Turns) SetMax(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.max = max(n, 0)
	for t.waiters.Len() > 0 && (t.max == 0 || t.held < t.max) {
		t.held++
		t.waiters.Remove(t.waiters.Front()).(chan struct{}) <- struct{}{}
	}
}

// Acquire takes a turn, waiting in line until deadline (zero: no wait) or
// until stop is closed; it reports whether it took one, which Release
// gives back.
func (t *Turns) Acquire(deadline time.Time, stop <-chan struct{}) bool {
	t.mu.Lock()
	if t.max == 0 || t.held < t.max && t.waiters.Len() == 0 {
		t.held++
		t.mu.Unlock()
		return true
	}
	wait := time.Until(deadline)
	if deadline.IsZero() || wait <= 0 {
		t.mu.Unlock()
		return false
	}
	ch := make(chan struct{}, 1) // Release or SetMax sends the turn without waiting
	e := t.waiters.PushBack(ch)
	t.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
	case <-stop:
	}
	t.mu.Lock()
	select {
	case <-ch: // given meanwhile: give it on
		t.mu.Unlock()
		t.Release()
	default:
		t.waiters.Remove(e)
		t.mu.Unlock()
	}
	return false
}

// Release gives back a turn Acquire took: to the first waiter, if any.
func (t *Turns) Release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waiters.Len() > 0 && (t.max == 0 || t.held <= t.max) {
		t.waiters.Remove(t.waiters.Front()).(chan struct{}) <- struct{}{}
		return // held stays: the turn changed hands
	}
	t.held--
}

// Held returns the turns taken and not given back, and the work waiting.
func (t *Turns) Held() (held, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held, t.waiters.Len()
}
