// Package policies keeps an edge's compiled traffic policies (package
// policy), one per endpoint, owner and spec, so that the routes of a pool
// share one: its rate limit counts the pool's traffic on the edge as a
// whole. One the edge holds a route of is kept until its last such route
// goes (Hold, Release); the others (of endpoints other edges bound,
// compiled on first use by Get) are kept in a bounded cache, least
// recently used out first, and dropped when their route goes (Forget).
package policies

import (
	"container/list"
	"context"
	"crypto/tls"
	"slices"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/policy"
)

// Key is what a compiled policy is kept by: the endpoint, its owner (whose
// operator policy applies) and the agent's spec (as routes carry it).
type Key struct {
	Endpoint       names.Endpoint
	Identity, Spec string
}

// Compiled is the policy of an endpoint on the edge, or why it could not
// be compiled.
type Compiled struct {
	key   Key
	ready chan struct{} // closed once pol or err is set
	pol   *policy.Policy
	err   error
	at    time.Time // when err came

	// Under Cache.mu:
	refs    int           // routes the edge holds that use it
	elem    *list.Element // in Cache.idle while refs is zero
	started bool          // a compile of it is under way, or done

	tlsOnce sync.Once
	tls     *tls.Config
}

// Policy returns the compiled policy; nil (which still strips reserved
// headers in Check) for none, or for a nil Compiled.
func (c *Compiled) Policy() *policy.Policy {
	if c == nil {
		return nil
	}
	return c.pol
}

// TLS returns the TLS configuration of handshakes for the policy's
// endpoint, made by mk on first use.
func (c *Compiled) TLS(mk func() *tls.Config) *tls.Config {
	c.tlsOnce.Do(func() { c.tls = mk() })
	return c.tls
}

func (c *Compiled) done() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Cache is the compiled policies of an edge. Set its fields before the
// first use.
type Cache struct {
	// Max bounds the policies kept for endpoints the edge holds no route
	// of. Zero: no bound.
	Max int
	// Retry is how long a policy that could not be compiled is refused
	// before the next Get compiles it again.
	Retry time.Duration
	// Timeout bounds compiling a policy on first use (an OIDC provider's
	// discovery).
	Timeout time.Duration
	// Now is the clock of Retry. Nil: time.Now.
	Now func() time.Time

	mu sync.Mutex
	// byEndpoint holds the policies of each endpoint: one, but while
	// routes of another owner or spec come and go. A lookup compares the
	// spec of the few there, which costs nothing when it is the string of
	// the route the policy was compiled for (the Router hands out copies
	// of one route), rather than hash it, as a key of a map would.
	byEndpoint map[names.Endpoint][]*Compiled
	idle       list.List // of *Compiled with refs zero, most recently used first
	n          int       // policies held in byEndpoint
}

// getLocked returns the policy of k, or nil.
func (ps *Cache) getLocked(k Key) *Compiled {
	for _, cp := range ps.byEndpoint[k.Endpoint] {
		if cp.key.Identity == k.Identity && cp.key.Spec == k.Spec {
			return cp
		}
	}
	return nil
}

// putLocked adds cp, whose key no other has.
func (ps *Cache) putLocked(cp *Compiled) {
	if ps.byEndpoint == nil {
		ps.byEndpoint = map[names.Endpoint][]*Compiled{}
	}
	ps.byEndpoint[cp.key.Endpoint] = append(ps.byEndpoint[cp.key.Endpoint], cp)
	ps.n++
}

// removeLocked removes cp, if it is there.
func (ps *Cache) removeLocked(cp *Compiled) {
	held := ps.byEndpoint[cp.key.Endpoint]
	if i := slices.Index(held, cp); i >= 0 {
		ps.n--
		if len(held) == 1 {
			delete(ps.byEndpoint, cp.key.Endpoint)
		} else {
			ps.byEndpoint[cp.key.Endpoint] = slices.Delete(slices.Clone(held), i, i+1)
		}
	}
	if cp.elem != nil {
		ps.idle.Remove(cp.elem)
		cp.elem = nil
	}
}

func (ps *Cache) now() time.Time {
	if ps.Now != nil {
		return ps.Now()
	}
	return time.Now()
}

// Len returns how many policies the cache keeps.
func (ps *Cache) Len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.n
}

// Hold keeps the policy of k, of a route the edge bound, compiled as pol,
// until Release: a policy compiled for k already (a pool's, or on first
// use of the route) is kept instead, and so are its rate limit's counts.
func (ps *Cache) Hold(k Key, pol *policy.Policy) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	cp := ps.getLocked(k)
	if cp == nil || !cp.done() || cp.err != nil {
		refs := 0
		if cp != nil {
			refs = cp.refs // a Renew's, not compiled again yet
			ps.removeLocked(cp)
		}
		cp = &Compiled{key: k, ready: closedChan, pol: pol, refs: refs, started: true}
		ps.putLocked(cp)
	}
	if cp.elem != nil {
		ps.idle.Remove(cp.elem)
		cp.elem = nil
	}
	cp.refs++
}

// Release ends a Hold of k, dropping the compiled policy with its last
// route on the edge.
func (ps *Cache) Release(k Key) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	cp := ps.getLocked(k)
	if cp == nil || cp.refs == 0 {
		return
	}
	if cp.refs--; cp.refs == 0 {
		ps.removeLocked(cp)
	}
}

// Forget drops the policy compiled on first use for k, of a route of
// another edge that went, unless the edge holds a route of it.
func (ps *Cache) Forget(k Key) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if cp := ps.getLocked(k); cp != nil && cp.refs == 0 {
		ps.removeLocked(cp)
	}
}

// Get returns the compiled policy of k: the one kept, whatever ctx, or
// else one compile makes now (other calls for it wait for that, within
// their ctx; compile's context is bounded by Timeout alone, not by ctx:
// it compiles for every caller). A policy compile failed to make is
// refused (with compile's error) for Retry, then compiled again.
func (ps *Cache) Get(ctx context.Context, k Key, compile func(context.Context) (*policy.Policy, error)) (*Compiled, error) {
	ps.mu.Lock()
	cp := ps.getLocked(k)
	if cp != nil && cp.done() && cp.err != nil && ps.now().Sub(cp.at) >= ps.Retry {
		ps.removeLocked(cp)
		cp = nil
	}
	if cp != nil && !cp.started {
		// Renewed: this call compiles it.
		cp.started = true
		ps.mu.Unlock()
		ps.compile(ctx, cp, compile)
		return cp, cp.err
	}
	if cp != nil {
		if cp.elem != nil {
			ps.idle.MoveToFront(cp.elem)
		}
		ps.mu.Unlock()
		select {
		case <-cp.ready:
		case <-ctx.Done():
			if !cp.done() { // else both were: the policy is had
				return nil, ctx.Err()
			}
		}
		return cp, cp.err
	}
	cp = &Compiled{key: k, ready: make(chan struct{}), started: true}
	ps.putLocked(cp)
	cp.elem = ps.idle.PushFront(cp)
	for ps.Max > 0 && ps.idle.Len() > ps.Max {
		ps.removeLocked(ps.idle.Back().Value.(*Compiled))
	}
	ps.mu.Unlock()
	ps.compile(ctx, cp, compile)
	return cp, cp.err
}

// compile compiles cp, which this call started, and tells its waiters.
func (ps *Cache) compile(ctx context.Context, cp *Compiled, compile func(context.Context) (*policy.Policy, error)) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ps.Timeout)
	defer cancel()
	cp.pol, cp.err = compile(cctx)
	if cp.err != nil {
		cp.at = ps.now()
	}
	close(cp.ready)
}

// Renew makes every policy kept be compiled again at its next Get, which
// waits for that compile (the operator's policy changed): those routes
// the edge holds keep their holds, and their next traffic is checked by
// the new policy or, if it cannot be compiled, refused; the others go.
// Rate limits start their counts anew.
func (ps *Cache) Renew() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var held []*Compiled
	for _, list := range ps.byEndpoint {
		for _, cp := range list {
			if cp.refs > 0 {
				held = append(held, cp)
			}
		}
	}
	clear(ps.byEndpoint)
	ps.idle.Init()
	ps.n = 0
	for _, cp := range held {
		ps.putLocked(&Compiled{key: cp.key, ready: make(chan struct{}), refs: cp.refs})
	}
}
