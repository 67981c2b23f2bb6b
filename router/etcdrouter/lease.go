package etcdrouter

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseState is this edge's lease, which its routes are attached to.
type leaseState struct {
	mu      sync.Mutex
	id      clientv3.LeaseID // 0 while there is none
	changed chan struct{}    // closed when id changes
	// bad receives a lease etcd said it did not know, from a Bind.
	bad chan clientv3.LeaseID
}

func (r *Router) setLease(id clientv3.LeaseID) {
	r.lease.mu.Lock()
	defer r.lease.mu.Unlock()
	if r.lease.id != id {
		r.lease.id = id
		close(r.lease.changed)
		r.lease.changed = make(chan struct{})
	}
}

func (r *Router) currentLease() clientv3.LeaseID {
	r.lease.mu.Lock()
	defer r.lease.mu.Unlock()
	return r.lease.id
}

// leaseFor returns this edge's lease, waiting for one other than bad when
// there is none.
func (r *Router) leaseFor(ctx context.Context, bad clientv3.LeaseID) (clientv3.LeaseID, error) {
	for {
		r.lease.mu.Lock()
		id, changed := r.lease.id, r.lease.changed
		r.lease.mu.Unlock()
		if id != 0 && id != bad {
			return id, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-r.ctx.Done():
			return 0, errClosed
		}
	}
}

// leaseLost tells keepLease that etcd does not know lease id.
func (r *Router) leaseLost(id clientv3.LeaseID) {
	select {
	case r.lease.bad <- id:
	default:
	}
}

// keepLease keeps this edge's lease alive until Close. When the lease
// expired (the keep-alive failed for longer than its TTL, or a Bind found
// it gone), it grants a new one and has syncOwn bind this edge's routes
// again under it.
func (r *Router) keepLease(id clientv3.LeaseID) {
	defer r.wg.Done()
	var bo backoff
	for {
		start := time.Now()
		ran := r.keepAlive(id)
		if r.ctx.Err() != nil {
			return
		}
		if ran && time.Since(start) > time.Duration(r.ttl)*time.Second {
			bo.reset()
		} else if !bo.wait(r.ctx) { // it stopped at once: do not spin
			return
		}
		alive, ok := r.leaseAlive(id)
		if !ok {
			return
		}
		if alive {
			continue
		}
		r.setLease(0)
		if r.testHookLeaseLost != nil {
			r.testHookLeaseLost()
		}
		r.log.Warn("etcdrouter: this edge's lease expired and its routes with it; binding them again under a new lease", "lease", id)
		if id = r.grant(); id == 0 {
			return
		}
		r.setLease(id)
		bo.reset()
		r.poke()
	}
}

// keepAlive sends keep-alives for lease id until they stop (the lease
// expired, or none got through for its TTL), a Bind reports it gone, or
// the Router is closed. It returns false if it could not start.
func (r *Router) keepAlive(id clientv3.LeaseID) bool {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	ch, err := r.client.KeepAlive(ctx, id)
	if err != nil {
		r.log.Info("etcdrouter: lease keep-alive", "err", err)
		return false
	}
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return true
			}
		case bad := <-r.lease.bad:
			if bad == id {
				return true
			}
		case <-r.ctx.Done():
			return true
		}
	}
}

// leaseAlive asks etcd whether lease id is alive, until it answers. ok is
// false if the Router was closed first.
func (r *Router) leaseAlive(id clientv3.LeaseID) (alive, ok bool) {
	var bo backoff
	for {
		ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
		resp, err := r.client.TimeToLive(ctx, id)
		cancel()
		switch {
		case r.ctx.Err() != nil:
			return false, false
		case err == nil:
			return resp.TTL > 0, true
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return false, true
		}
		if r.ctx.Err() == nil {
			r.log.Info("etcdrouter: checking this edge's lease", "err", err)
		}
		if !bo.wait(r.ctx) {
			return false, false
		}
	}
}

// grant grants a new lease for this edge, trying until it gets one; 0 if
// the Router was closed first.
func (r *Router) grant() clientv3.LeaseID {
	var bo backoff
	for {
		ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
		g, err := r.client.Grant(ctx, r.ttl)
		cancel()
		if err == nil {
			return g.ID
		}
		if r.ctx.Err() == nil {
			r.log.Info("etcdrouter: granting a lease", "err", err)
		}
		if !bo.wait(r.ctx) {
			return 0
		}
	}
}

// poke wakes syncOwn.
func (r *Router) poke() {
	select {
	case r.syncCh <- struct{}{}:
	default:
	}
}

// syncOwn binds this edge's routes again when keepLease granted a new lease
// (bound is the lease they are bound under), and retries the Unbinds that
// failed, until Close.
func (r *Router) syncOwn(bound clientv3.LeaseID) {
	defer r.wg.Done()
	var bo backoff
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.syncCh:
		case <-retry.C:
		}
		done := true
		if id := r.currentLease(); id != 0 && id != bound {
			if r.registerAgain(id) && r.rebind(id) {
				bound = id
			} else {
				done = false
			}
		}
		if !r.retryUnbinds() { // after rebind, which may add to them
			done = false
		}
		if done {
			bo.reset()
		} else {
			retry.Reset(bo.next())
		}
	}
}

// rebind binds this edge's routes again under lease id, respecting
// ownership: a route whose name another owner took meanwhile is dropped.
// It reports whether it went through them all.
func (r *Router) rebind(id clientv3.LeaseID) bool {
	r.ownMu.Lock()
	own := maps.Clone(r.own)
	r.ownMu.Unlock()
	done := true
	for key, rt := range own {
		if r.ctx.Err() != nil || r.currentLease() != id {
			return false
		}
		if !r.owns(key) {
			continue // unbound meanwhile
		}
		ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
		rev, wrote, _, err := r.bind(ctx, rt, r.keysOf(rt), "", true)
		if err == nil {
			r.await(ctx, rev) // so that an Unbind from now on knows of it (see Unbind's before)
		}
		cancel()
		switch {
		case errors.Is(err, router.ErrNameTaken):
			r.ownMu.Lock()
			delete(r.own, key)
			r.ownMu.Unlock()
			r.log.Warn("etcdrouter: route dropped: another owner took its name while this edge's lease had expired",
				"proto", rt.Proto, "name", rt.Name, "identity", rt.Identity, "session", rt.SessionID, "tunnel", rt.TunnelID, "err", err)
		case err != nil:
			if r.ctx.Err() == nil {
				r.log.Info("etcdrouter: binding a route again", "proto", rt.Proto, "name", rt.Name, "err", err)
			}
			done = false
		case wrote && !r.owns(key):
			// Unbound while it was being put: take it back.
			r.ownMu.Lock()
			if _, ok := r.pending[key]; !ok {
				r.pending[key] = pendingUnbind{route: rt, before: rev}
			}
			r.ownMu.Unlock()
		}
	}
	return done
}

// owns reports whether the route with key is bound through this Router.
func (r *Router) owns(key string) bool {
	r.ownMu.Lock()
	defer r.ownMu.Unlock()
	_, ok := r.own[key]
	return ok
}

// retryUnbinds retries the Unbinds that failed; it reports whether they
// all went through.
func (r *Router) retryUnbinds() bool {
	r.ownMu.Lock()
	pending := maps.Clone(r.pending)
	r.ownMu.Unlock()
	done := true
	for key, p := range pending {
		if r.ctx.Err() != nil {
			return false
		}
		var reserve time.Duration
		if !p.until.IsZero() {
			reserve = time.Until(p.until)
		}
		ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
		_, err := r.unbind(ctx, p.route, r.keysOf(p.route), reserve, p.before)
		cancel()
		if err != nil {
			done = false
			continue
		}
		r.ownMu.Lock()
		if r.pending[key] == p {
			delete(r.pending, key)
		}
		r.ownMu.Unlock()
	}
	return done
}
