package etcdrouter

import (
	"context"
	"fmt"
	"maps"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/router"
)

// loadPage is how many keys load reads per request; loadTimeout bounds a
// whole load.
const (
	loadPage    = 5000
	loadTimeout = time.Minute
)

// Lookup implements [router.Router] from the cache, without talking to etcd
// (so it answers while etcd cannot be reached): the routes of the most
// specific pattern of proto matching host, round robin over a pool, the
// routes reported with Fail last. Each route's Edge is the ID of the edge
// holding its session. It never blocks, so it has no use for ctx.
func (r *Router) Lookup(_ context.Context, proto, host string) ([]router.Route, error) {
	if r.closed.Load() {
		return nil, errClosed
	}
	t := (*r.tables.Load())[proto]
	if t == nil {
		return nil, nil
	}
	var out []router.Route
	for rt := range t.Backends(host) {
		out = append(out, rt)
	}
	return out, nil
}

// LookupPath implements [router.PathRouter] from the cache, as Lookup
// does: the routes of the longest Path of the most specific pattern of
// proto matching host that path is under, else of the pattern's routes
// without a Path.
func (r *Router) LookupPath(_ context.Context, proto, host, path string) ([]router.Route, error) {
	if r.closed.Load() {
		return nil, errClosed
	}
	t := (*r.tables.Load())[proto]
	if t == nil {
		return nil, nil
	}
	var out []router.Route
	for rt := range t.BackendsAt(host, path) {
		out = append(out, rt)
	}
	return out, nil
}

// Fail implements [router.HealthReporter]: later lookups from this Router
// try rt after the other routes of its pool for a cooldown, as
// [router.Table.Fail] does (router.DefaultCooldown, doubled for each
// outage in a row up to router.MaxCooldownFactor times). Other edges do
// not hear of it.
func (r *Router) Fail(rt router.Route) {
	if t := (*r.tables.Load())[rt.Proto]; t != nil {
		t.Fail(rt)
	}
}

// Succeed implements [router.HealthReporter]: it ends rt's failing mark.
func (r *Router) Succeed(rt router.Route) {
	if t := (*r.tables.Load())[rt.Proto]; t != nil {
		t.Succeed(rt)
	}
}

// keepCache keeps the cache current from revision rev on, until Close: it
// follows a watch of the prefix (with the previous value of each key, so
// that a deletion says which route went), and loads the cache again when
// the watch fails (its revision was compacted, it lost etcd's leader).
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
	for resp := range r.client.Watch(ctx, r.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV()) {
		if err := resp.Err(); err != nil {
			if r.ctx.Err() == nil {
				r.log.Info("etcdrouter: watch", "err", err)
			}
			return 0, ok
		}
		ok = true
		if rev = r.apply(resp.Events, rev); rev == 0 {
			return 0, ok
		}
	}
	return rev, ok
}

// apply applies the events of a watch response to the cache, and returns
// the revision the cache reflects afterwards, or 0 when an event did not
// say what it replaced or removed (its previous value was compacted): the
// cache must be loaded again.
func (r *Router) apply(events []*clientv3.Event, rev int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events {
		value := ev.Kv.Value
		if ev.Type != mvccpb.PUT {
			value = nil
		}
		if r.cacheReservationLocked(string(ev.Kv.Key), value) {
			rev = max(rev, ev.Kv.ModRevision)
			continue
		}
		if id, ok := r.memberOf(string(ev.Kv.Key)); ok {
			if ev.Type == mvccpb.PUT {
				r.members[id] = struct{}{}
			} else {
				delete(r.members, id)
			}
			rev = max(rev, ev.Kv.ModRevision)
			continue
		}
		if !r.isRoute(string(ev.Kv.Key)) {
			rev = max(rev, ev.Kv.ModRevision)
			continue
		}
		if ev.PrevKv != nil {
			if ev.Type == mvccpb.PUT && string(ev.PrevKv.Value) == string(ev.Kv.Value) {
				rev = max(rev, ev.Kv.ModRevision)
				continue // put again as it was (under a new lease)
			}
			if old, err := decode(ev.PrevKv.Value); err == nil {
				r.removeLocked(old)
			}
		} else if ev.Type == mvccpb.DELETE || ev.Kv.Version > 1 {
			return 0
		}
		if ev.Type == mvccpb.PUT {
			rt, err := decode(ev.Kv.Value)
			if err != nil {
				r.log.Info("etcdrouter: bad route", "key", string(ev.Kv.Key), "err", err)
			} else {
				r.addLocked(rt)
			}
		}
		rev = max(rev, ev.Kv.ModRevision)
	}
	r.advanceLocked(rev)
	return rev
}

// load reads every route and member under the prefix, at one revision,
// into the cache, and returns that revision.
func (r *Router) load(ctx context.Context) (int64, error) {
	fresh := map[router.Route]struct{}{}
	members := map[string]struct{}{}
	reserved := map[string]string{}
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
			if name, ok := r.reservationOf(string(kv.Key)); ok {
				if e, err := decode(kv.Value); err == nil {
					reserved[name] = e.Identity
				}
				continue
			}
			if id, ok := r.memberOf(string(kv.Key)); ok {
				members[id] = struct{}{}
				continue
			}
			if !r.isRoute(string(kv.Key)) {
				continue
			}
			rt, err := decode(kv.Value)
			if err != nil {
				r.log.Info("etcdrouter: bad route", "key", string(kv.Key), "err", err)
				continue
			}
			fresh[rt] = struct{}{}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members, r.reserved = members, reserved
	for _, rt := range r.allLocked() {
		if _, ok := fresh[rt]; ok {
			delete(fresh, rt) // cached already
		} else {
			r.removeLocked(rt)
		}
	}
	for rt := range fresh {
		r.addLocked(rt)
	}
	r.advanceLocked(rev)
	return rev, nil
}

// allLocked returns every route in the cache.
func (r *Router) allLocked() []router.Route {
	var all []router.Route
	for _, t := range *r.tables.Load() {
		for _, name := range t.Names() {
			for _, path := range t.Paths(name) {
				all = append(all, t.PoolAt(name, path)...)
			}
		}
	}
	return all
}

// addLocked adds rt, not in the cache, to it.
func (r *Router) addLocked(rt router.Route) {
	if err := r.tableLocked(rt.Proto).AddAt(rt.Name, rt.Path, rt); err != nil {
		r.log.Info("etcdrouter: bad route", "route", rt, "err", err)
		return
	}
	r.notifyLocked(rt, true)
}

// removeLocked removes rt from the cache.
func (r *Router) removeLocked(rt router.Route) {
	if t := (*r.tables.Load())[rt.Proto]; t != nil && t.RemoveAt(rt.Name, rt.Path, rt) {
		r.notifyLocked(rt, false)
	}
}

// tableLocked returns the table of proto, adding it if need be.
func (r *Router) tableLocked(proto string) *router.Table[router.Route] {
	tables := *r.tables.Load()
	if t := tables[proto]; t != nil {
		return t
	}
	t := new(router.Table[router.Route])
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
// rev must be that of a change under the prefix (the watch sees no other),
// or older.
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

// awaitGone waits until the cache holds no route with rt's key (its Proto,
// Name, Edge, SessionID and TunnelID). etcd had none when asked: if the
// cache has one, its deletion is on its way.
func (r *Router) awaitGone(ctx context.Context, rt router.Route) error {
	for {
		r.mu.Lock()
		held, ch := r.cachedLocked(rt), r.revCh
		r.mu.Unlock()
		if !held {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("etcdrouter: waiting for the watch to report %s %s gone: %w", rt.Proto, rt.Name, ctx.Err())
		case <-r.ctx.Done():
			return errClosed
		}
	}
}

// cachedLocked reports whether the cache holds a route with rt's key.
func (r *Router) cachedLocked(rt router.Route) bool {
	t := (*r.tables.Load())[rt.Proto]
	if t == nil {
		return false
	}
	for _, c := range t.PoolAt(rt.Name, rt.Path) {
		if c.Edge == rt.Edge && c.SessionID == rt.SessionID && c.TunnelID == rt.TunnelID {
			return true
		}
	}
	return false
}
