package etcdrouter

import (
	"context"
	"fmt"
	"maps"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/router"
)

// loadPage is how many keys load reads per request; loadTimeout bounds a
// whole load.
const (
	loadPage    = 5000
	loadTimeout = time.Minute
)

// Lookup implements [edge.Router] from the cache, without talking to etcd
// (so it answers while etcd cannot be reached): the routes of the most
// specific pattern of proto matching host, round robin over a pool, the
// routes reported with Fail last. Each route's Edge is the ID of the edge
// holding its session. It never blocks, so it has no use for ctx.
func (r *Router) Lookup(_ context.Context, proto, host string) ([]edge.Route, error) {
	if r.closed.Load() {
		return nil, errClosed
	}
	t := (*r.tables.Load())[proto]
	if t == nil {
		return nil, nil
	}
	var out []edge.Route
	for rt := range t.Backends(host) {
		out = append(out, rt)
	}
	return out, nil
}

// Fail implements [edge.HealthReporter]: later lookups from this Router
// try rt after the other routes of its pool, for router.DefaultCooldown.
// Other edges do not hear of it.
func (r *Router) Fail(rt edge.Route) {
	if t := (*r.tables.Load())[rt.Proto]; t != nil {
		t.Fail(rt)
	}
}

// Succeed implements [edge.HealthReporter]: it ends rt's failing mark.
func (r *Router) Succeed(rt edge.Route) {
	if t := (*r.tables.Load())[rt.Proto]; t != nil {
		t.Succeed(rt)
	}
}

// keepCache keeps the cache current from revision rev on, until Close: it
// follows a watch of the prefix, and loads the cache again when the watch
// fails (its revision was compacted, it lost etcd's leader).
func (r *Router) keepCache(rev int64) {
	defer r.wg.Done()
	var bo backoff
	for r.ctx.Err() == nil {
		if rev == 0 {
			ctx, cancel := context.WithTimeout(r.ctx, loadTimeout)
			loaded, err := r.load(ctx)
			cancel()
			if err != nil {
				if r.ctx.Err() == nil {
					r.log.Info("etcdrouter: loading routes", "err", err)
				}
				bo.wait(r.ctx)
				continue
			}
			rev = loaded
		}
		var ok bool
		if rev, ok = r.follow(rev); ok {
			bo.reset()
		} else {
			bo.wait(r.ctx)
		}
	}
}

// follow applies the changes after revision rev as a watch reports them,
// until the watch ends. It returns the revision applied, or 0 when the
// cache must be loaded again; ok is false if the watch ended before it
// reported anything.
func (r *Router) follow(rev int64) (last int64, ok bool) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.ctx))
	defer cancel()
	for resp := range r.client.Watch(ctx, r.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			if r.ctx.Err() == nil {
				r.log.Info("etcdrouter: watch", "err", err)
			}
			return 0, ok
		}
		ok = true
		rev = r.apply(resp.Events, rev)
	}
	return rev, ok
}

// apply applies the events of a watch response to the cache, and returns
// the revision the cache reflects afterwards.
func (r *Router) apply(events []*clientv3.Event, rev int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events {
		key := string(ev.Kv.Key)
		switch ev.Type {
		case mvccpb.PUT:
			if !r.isRoute(key) {
				break
			}
			rt, err := decode(ev.Kv.Value)
			if err != nil {
				r.log.Info("etcdrouter: bad route", "key", key, "err", err)
				r.removeLocked(key)
				break
			}
			r.putLocked(key, rt)
		case mvccpb.DELETE:
			r.removeLocked(key)
		}
		rev = max(rev, ev.Kv.ModRevision)
	}
	r.advanceLocked(rev)
	return rev
}

// load reads every route under the prefix, at one revision, into the
// cache, and returns that revision.
func (r *Router) load(ctx context.Context) (int64, error) {
	fresh := map[string]edge.Route{}
	key, end := r.prefix, clientv3.GetPrefixRangeEnd(r.prefix)
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(loadPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := r.client.Get(ctx, key, opts...)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			if !r.isRoute(k) {
				continue
			}
			rt, err := decode(kv.Value)
			if err != nil {
				r.log.Info("etcdrouter: bad route", "key", k, "err", err)
				continue
			}
			fresh[k] = rt
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, old := range r.routes {
		if rt, ok := fresh[k]; !ok || rt != old {
			r.removeLocked(k)
		}
	}
	for k, rt := range fresh {
		r.putLocked(k, rt)
	}
	r.advanceLocked(rev)
	return rev, nil
}

// putLocked stores the route of key in the cache.
func (r *Router) putLocked(key string, rt edge.Route) {
	old, ok := r.routes[key]
	if ok && old == rt {
		return
	}
	if ok {
		r.removeLocked(key)
	}
	if err := r.tableLocked(rt.Proto).Add(rt.Name, rt); err != nil {
		r.log.Info("etcdrouter: bad route", "key", key, "err", err)
		return
	}
	r.routes[key] = rt
	r.notifyLocked(rt, true)
}

// removeLocked removes the route of key from the cache.
func (r *Router) removeLocked(key string) {
	old, ok := r.routes[key]
	if !ok {
		return
	}
	delete(r.routes, key)
	r.tableLocked(old.Proto).Remove(old.Name, old)
	r.notifyLocked(old, false)
}

// tableLocked returns the table of proto, adding it if need be.
func (r *Router) tableLocked(proto string) *router.Table[edge.Route] {
	tables := *r.tables.Load()
	if t := tables[proto]; t != nil {
		return t
	}
	t := new(router.Table[edge.Route])
	tables = maps.Clone(tables)
	tables[proto] = t
	r.tables.Store(&tables)
	return t
}

// advanceLocked records that the cache reflects the store at revision rev.
func (r *Router) advanceLocked(rev int64) {
	if rev > r.rev {
		r.rev = rev
		close(r.revCh)
		r.revCh = make(chan struct{})
	}
}

// await waits until the cache reflects the store at revision rev or later.
func (r *Router) await(ctx context.Context, rev int64) error {
	for {
		r.mu.Lock()
		cur, ch := r.rev, r.revCh
		r.mu.Unlock()
		if cur >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("etcdrouter: waiting for the watch to reach revision %d: %w", rev, ctx.Err())
		case <-r.ctx.Done():
			return errClosed
		}
	}
}
