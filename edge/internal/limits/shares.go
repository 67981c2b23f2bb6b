package limits

import (
	"net/netip"
	"sync"
)

// Shares counts, per endpoint (of type E) and client source, the streams
// in use: a public client may hold only its share of an endpoint. Its
// zero value is ready to use.
type Shares[E comparable] struct {
	mu sync.Mutex
	n  map[shareKey[E]]int
}

type shareKey[E comparable] struct {
	endpoint E
	client   netip.Prefix
}

// Acquire takes one of client's share of endpoint, of which it may hold
// max (zero: no bound), or reports false when the client holds all of it.
// release gives it back; calling it again does nothing.
func (sh *Shares[E]) Acquire(endpoint E, client netip.Prefix, max int) (release func(), ok bool) {
	if max == 0 {
		return func() {}, true
	}
	k := shareKey[E]{endpoint, client}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.n[k] >= max {
		return nil, false
	}
	if sh.n == nil {
		sh.n = map[shareKey[E]]int{}
	}
	sh.n[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			if sh.n[k]--; sh.n[k] <= 0 {
				delete(sh.n, k)
			}
		})
	}, true
}
