package etcdrouter

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// IsMember implements [router.MemberChecker]: it reports whether the edge
// with ID id is registered under the prefix, which a Router does for its
// edge from New until Close (under its lease: a dead edge is gone within
// its TTL). It answers from the cache for an edge it knows, and otherwise
// asks etcd, within ctx, so that an edge that joined a moment ago, and
// that the cache has not heard of yet, is a member already. When etcd
// cannot be reached, an edge the cache does not know fails with an error.
func (r *Router) IsMember(ctx context.Context, id string) (bool, error) {
	if r.closed.Load() {
		return false, errClosed
	}
	r.mu.Lock()
	_, ok := r.members[id]
	r.mu.Unlock()
	if ok {
		return true, nil
	}
	resp, err := r.client.Get(ctx, r.memberKey(id), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("etcdrouter: is edge %q a member: %w", id, err)
	}
	return resp.Count > 0, nil
}

// register registers this edge as a member, under lease id.
func (r *Router) register(ctx context.Context, id clientv3.LeaseID) error {
	if _, err := r.client.Put(ctx, r.memberKey(r.edge), r.edge, clientv3.WithLease(id)); err != nil {
		return fmt.Errorf("etcdrouter: register edge %q: %w", r.edge, err)
	}
	return nil
}

// registerAgain registers this edge again under the new lease id (its
// registration went with the lease that expired), and reports whether it
// did.
func (r *Router) registerAgain(id clientv3.LeaseID) bool {
	ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
	defer cancel()
	err := r.register(ctx, id)
	if err != nil && r.ctx.Err() == nil {
		r.log.Info("etcdrouter: registering this edge again", "err", err)
	}
	return err == nil
}
