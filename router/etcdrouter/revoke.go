package etcdrouter

import (
	"context"
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/router"
)

// The identities revoked ([router.Revoker]): a key each,
// "<prefix>revoked/<identity>" (path-escaped), whose value is when the
// revocation lapses (RFC 3339), attached to a lease of its own that ends
// then, so that etcd drops it. Revoked asks etcd, so that a revocation made
// through any edge counts at once; the cache does not keep them.

var _ router.Revoker = (*Router)(nil)

// revokedKey returns the key of identity's revocation.
func (r *Router) revokedKey(identity string) string {
	return r.prefix + "revoked/" + url.PathEscape(identity)
}

// Revoke implements [router.Revoker], in one transaction per attempt: it
// writes the revocation under a new lease unless the one stored lasts as
// long, and only if it did not change since it was read.
func (r *Router) Revoke(ctx context.Context, identity string, until time.Time) error {
	if r.closed.Load() {
		return errClosed
	}
	if identity == "" {
		return fmt.Errorf("etcdrouter: %w: empty", router.ErrInvalidIdentity)
	}
	key := r.revokedKey(identity)
	for {
		left := time.Until(until)
		if left <= 0 {
			return nil
		}
		resp, err := r.client.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("etcdrouter: revoke %q: %w", identity, err)
		}
		unchanged := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		var old clientv3.LeaseID
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			if was, err := time.Parse(time.RFC3339Nano, string(kv.Value)); err == nil && !until.After(was) {
				return nil // revoked for as long already
			}
			unchanged, old = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision), clientv3.LeaseID(kv.Lease)
		}
		g, err := r.client.Grant(ctx, seconds(left))
		if err != nil {
			return fmt.Errorf("etcdrouter: revoke %q: %w", identity, err)
		}
		w, err := r.client.Txn(ctx).If(unchanged).Then(clientv3.OpPut(key, until.UTC().Format(time.RFC3339Nano), clientv3.WithLease(g.ID))).Commit()
		if err == nil && w.Succeeded {
			if old != 0 {
				r.client.Revoke(ctx, old) // the lease of the revocation replaced, which holds nothing else
			}
			return nil
		}
		r.client.Revoke(context.WithoutCancel(ctx), g.ID) // it holds nothing
		if err != nil {
			return fmt.Errorf("etcdrouter: revoke %q: %w", identity, err)
		}
	}
}

// Revoked implements [router.Revoker]: it asks etcd. A revocation whose
// lease etcd has not ended yet counts until the time it was given.
func (r *Router) Revoked(ctx context.Context, identity string) (bool, error) {
	if r.closed.Load() {
		return false, errClosed
	}
	resp, err := r.client.Get(ctx, r.revokedKey(identity))
	if err != nil {
		return false, fmt.Errorf("etcdrouter: revoked %q: %w", identity, err)
	}
	if len(resp.Kvs) == 0 {
		return false, nil
	}
	until, err := time.Parse(time.RFC3339Nano, string(resp.Kvs[0].Value))
	return err != nil || time.Now().Before(until), nil
}
