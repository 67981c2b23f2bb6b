package etcdrouter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/router"
)

// Bind implements [router.Router]. It decides the ownership rules in one etcd
// transaction per attempt: it reads, at one revision, the entries of the
// route's base and of every name under it, and those of each name above it;
// checks the rules against them; and writes the route, attached to this
// edge's lease, only if no key in those ranges was written since. When
// another Bind wrote one meanwhile, it tries again.
//
// rt.Edge must be empty or this Router's Edge; the route is stored with this
// Router's Edge. A Bind that returns nil is visible to this Router's Lookup
// at once. When etcd cannot be reached, Bind fails, with an error that does
// not wrap router.ErrNameTaken, when ctx ends.
func (r *Router) Bind(ctx context.Context, rt router.Route) error {
	return r.bindFrom(ctx, rt, "")
}

// Move implements [router.Mover] as Bind does Bind, in the same
// transaction that deletes the routes of rt's Proto and Name that the
// session from holds, whichever edge they are of: it puts rt first, so
// that the watch of every edge reports rt before their deletion, and no
// lookup finds the name unrouted in between.
func (r *Router) Move(ctx context.Context, rt router.Route, from string) error {
	return r.bindFrom(ctx, rt, from)
}

// bindFrom binds rt, in the place of the routes of its name of the session
// from when from is not empty.
func (r *Router) bindFrom(ctx context.Context, rt router.Route, from string) error {
	if r.closed.Load() {
		return errClosed
	}
	name, ok := router.NormalisePattern(rt.Name)
	if !ok {
		return fmt.Errorf("etcdrouter: %w: %q", router.ErrInvalidName, rt.Name)
	}
	path, err := router.RoutePath(rt)
	if err != nil {
		return err
	}
	rt.Name, rt.Path = name, path
	switch rt.Edge {
	case "":
		rt.Edge = r.edge
	case r.edge:
	default:
		return fmt.Errorf("etcdrouter: bind: a route of edge %q bound through edge %q", rt.Edge, r.edge)
	}
	k := r.keysOf(rt)
	rev, _, moved, err := r.bind(ctx, rt, k, from, false)
	if err != nil {
		return err
	}
	r.ownMu.Lock()
	r.own[k.route] = rt
	delete(r.pending, k.route)
	for _, key := range moved {
		delete(r.own, key) // gone: not to be bound again
	}
	r.ownMu.Unlock()
	if err := r.await(ctx, rev); err != nil {
		// Bound, but not visible here yet, and the edge will not use
		// it: take it back (at once if etcd answers, else later).
		r.ownMu.Lock()
		delete(r.own, k.route)
		r.pending[k.route] = pendingUnbind{route: rt, before: rev}
		r.ownMu.Unlock()
		r.poke()
		return err
	}
	return nil
}

// bind binds rt, whose Name is normalised and Edge set, and returns the
// store's revision that has it. With from set, it deletes in the same
// transaction the routes of rt's Proto and Name of the session from, and
// returns their keys (moved). With refresh set it binds a route of this
// edge again under the current lease (when the lease it was bound under
// expired): a stored route of the same key is put again, attached to the
// current lease, instead of being left as it is. wrote reports whether it
// put the route.
func (r *Router) bind(ctx context.Context, rt router.Route, k keys, from string, refresh bool) (rev int64, wrote bool, moved []string, err error) {
	value := encode(rt)
	reads := make([]clientv3.Op, 0, 1+len(k.ancestors))
	reads = append(reads, clientv3.OpGet(k.tree, clientv3.WithPrefix()))
	for _, a := range k.ancestors {
		reads = append(reads, clientv3.OpGet(a, clientv3.WithPrefix()))
	}
	var bad clientv3.LeaseID // a lease etcd no longer knows
	for {
		lease, err := r.leaseFor(ctx, bad)
		if err != nil {
			return 0, false, nil, r.storeErr("bind", rt, err)
		}
		resp, err := r.client.Txn(ctx).Then(reads...).Commit()
		if err != nil {
			return 0, false, nil, r.storeErr("bind", rt, err)
		}
		rev := resp.Header.Revision
		d, err := decide(rt, k, from, resp.Responses)
		if err != nil {
			return 0, false, nil, err
		}
		if d.self != nil && (!refresh || clientv3.LeaseID(d.self.Lease) == lease) {
			return d.self.ModRevision, false, nil, nil // bound already
		}
		// Write only if no key read has been created or changed since.
		// Keys deleted since do not matter: a deletion frees names.
		cmps := make([]clientv3.Cmp, 0, len(reads))
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.tree), "<", rev+1).WithPrefix())
		for _, a := range k.ancestors {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(a), "<", rev+1).WithPrefix())
		}
		// The put comes first: the watch reports the events of a
		// transaction in the order of its operations.
		ops := []clientv3.Op{clientv3.OpPut(k.route, value, clientv3.WithLease(lease))}
		if d.reserved {
			ops = append(ops, clientv3.OpDelete(k.reserved)) // binding the name again ends its reservation
		}
		for _, key := range d.moved {
			ops = append(ops, clientv3.OpDelete(key))
		}
		w, err := r.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			r.leaseLost(lease)
			bad = lease
			continue
		case err != nil:
			return 0, false, nil, r.storeErr("bind", rt, err)
		case !w.Succeeded:
			continue // another Bind or Unbind wrote in the ranges read
		}
		return w.Header.Revision, true, d.moved, nil
	}
}

// decision is what the entries read for a Bind say, when they allow it.
type decision struct {
	self     *mvccpb.KeyValue // the route itself, bound already
	reserved bool             // its Proto and Name are reserved for its identity
	moved    []string         // the keys of the routes it takes the place of
}

// decide checks the ownership rules for binding rt against the entries read
// for it: reads[0] those of k.tree, reads[i] those of k.ancestors[i-1].
// The routes of rt's Proto and Name of the session from, when from is not
// empty, make room for rt.
func decide(rt router.Route, k keys, from string, reads []*etcdserverpb.ResponseOp) (decision, error) {
	var d decision
	var pooled, solo, otherPolicy, otherStrip int // the other routes of rt's Proto, Name and Path
	for i, op := range reads {
		for _, kv := range op.GetResponseRange().GetKvs() {
			key := string(kv.Key)
			e, err := decode(kv.Value)
			if err != nil {
				return d, fmt.Errorf("etcdrouter: bad entry %q: %w", key, err)
			}
			if e.Identity != rt.Identity {
				switch {
				case i > 0:
					return d, fmt.Errorf("%w: %s is under %s, held by another owner", router.ErrNameTaken, k.base, k.above[i-1])
				case strings.HasPrefix(key, k.own):
					return d, fmt.Errorf("%w: %s is held by another owner", router.ErrNameTaken, k.base)
				default:
					return d, fmt.Errorf("%w: names under %s are held by another owner", router.ErrNameTaken, k.base)
				}
			}
			if i > 0 || !strings.HasPrefix(key, k.routes) && key != k.reserved {
				continue // above, under, or another path's
			}
			switch {
			case key == k.route:
				d.self = kv
			case key == k.reserved:
				d.reserved = true
			case from != "" && e.SessionID == from:
				d.moved = append(d.moved, key)
			case e.Pool:
				pooled++
				if e.Policy != rt.Policy {
					otherPolicy++
				}
				if e.StripPrefix != rt.StripPrefix {
					otherStrip++
				}
			default:
				solo++
			}
		}
	}
	if d.self != nil {
		return d, nil
	}
	what := rt.Proto + " " + rt.Name + rt.Path
	if solo > 0 {
		return d, fmt.Errorf("%w: %s is bound already and not shared (its agent did not ask for a pool)", router.ErrNameTaken, what)
	}
	if pooled > 0 && !rt.Pool {
		return d, fmt.Errorf("%w: %s is a pool: bind with pool to join it", router.ErrNameTaken, what)
	}
	if otherPolicy > 0 {
		return d, fmt.Errorf("%w: %s is a pool with another traffic policy: its agents must declare the same one", router.ErrNameTaken, what)
	}
	if otherStrip > 0 {
		word := "do not strip"
		if !rt.StripPrefix {
			word = "strip"
		}
		return d, fmt.Errorf("%w: %s is a pool whose agents %s its path prefix: its agents must agree", router.ErrNameTaken, what, word)
	}
	return d, nil
}

// Unbind implements [router.Router]. A route with Edge empty is this edge's.
// The last route of its Proto and Name unbound with reserve > 0 leaves a
// reservation on a lease of its own whose TTL is reserve rounded up to whole
// seconds (etcd may raise it to its minimum TTL, about 2 s by default). A
// nil return means the route is gone from this Router's Lookup too. When
// etcd cannot be reached, Unbind fails when ctx ends; for a route of this
// edge, the Router goes on trying to remove it (with what is left of the
// reservation) until it can.
func (r *Router) Unbind(ctx context.Context, rt router.Route, reserve time.Duration) error {
	if r.closed.Load() {
		return errClosed
	}
	name, ok := router.NormalisePattern(rt.Name)
	if !ok {
		return nil
	}
	path, err := router.RoutePath(rt)
	if err != nil {
		return nil
	}
	rt.Name, rt.Path = name, path
	if rt.Edge == "" {
		rt.Edge = r.edge
	}
	k := r.keysOf(rt)
	// Forget it before it goes: syncOwn must not bind it again.
	r.ownMu.Lock()
	delete(r.own, k.route)
	delete(r.pending, k.route)
	r.ownMu.Unlock()
	r.mu.Lock()
	before := r.rev // the route to remove was bound by then (Bind waits for the cache)
	r.mu.Unlock()
	rev, err := r.unbind(ctx, rt, k, reserve, 0)
	if err != nil {
		if rt.Edge == r.edge {
			p := pendingUnbind{route: rt, before: before}
			if reserve > 0 {
				p.until = time.Now().Add(reserve)
			}
			r.ownMu.Lock()
			r.pending[k.route] = p
			r.ownMu.Unlock()
			r.poke()
		}
		return err
	}
	if rev == 0 {
		return r.awaitGone(ctx, rt)
	}
	return r.await(ctx, rev)
}

// unbind removes the route with k.route and returns the store's revision
// without it, or 0 if there was none to remove. With before > 0, it removes
// the route only if it was created at revision before or earlier: a retry
// must not remove the route bound again since.
func (r *Router) unbind(ctx context.Context, rt router.Route, k keys, reserve time.Duration, before int64) (int64, error) {
	if reserve <= 0 {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.route), ">", 0)}
		if before > 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.route), "<", before+1))
		}
		w, err := r.client.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(k.route)).Commit()
		switch {
		case err != nil:
			return 0, r.storeErr("unbind", rt, err)
		case !w.Succeeded:
			return 0, nil
		}
		return w.Header.Revision, nil
	}
	var lease clientv3.LeaseID // the reservation's
	defer func() {
		if lease != 0 {
			r.client.Revoke(ctx, lease) // unused; it would lapse anyway
		}
	}()
	for {
		resp, err := r.client.Get(ctx, k.routes, clientv3.WithPrefix())
		if err != nil {
			return 0, r.storeErr("unbind", rt, err)
		}
		read := resp.Header.Revision
		var self, other *mvccpb.KeyValue
		for _, kv := range resp.Kvs {
			if string(kv.Key) == k.route {
				self = kv
			} else {
				other = kv
			}
		}
		if self == nil || before > 0 && self.CreateRevision > before {
			return 0, nil
		}
		exists := clientv3.Compare(clientv3.CreateRevision(k.route), "=", self.CreateRevision)
		if other != nil {
			// Not the last: no reservation, provided that one other
			// route is still there.
			w, err := r.client.Txn(ctx).
				If(exists, clientv3.Compare(clientv3.CreateRevision(string(other.Key)), "=", other.CreateRevision)).
				Then(clientv3.OpDelete(k.route)).Commit()
			if err != nil {
				return 0, r.storeErr("unbind", rt, err)
			}
			if w.Succeeded {
				return w.Header.Revision, nil
			}
			continue
		}
		stored, err := decode(self.Value)
		if err != nil {
			stored = rt
		}
		if lease == 0 {
			g, err := r.client.Grant(ctx, seconds(reserve))
			if err != nil {
				return 0, r.storeErr("unbind", rt, err)
			}
			lease = g.ID
		}
		// The last: reserve, provided that no route joined it since.
		w, err := r.client.Txn(ctx).
			If(exists, clientv3.Compare(clientv3.ModRevision(k.routes), "<", read+1).WithPrefix()).
			Then(clientv3.OpDelete(k.route), clientv3.OpPut(k.reserved, encodeReservation(stored), clientv3.WithLease(lease))).
			Commit()
		if err != nil {
			return 0, r.storeErr("unbind", rt, err)
		}
		if w.Succeeded {
			lease = 0 // in use
			return w.Header.Revision, nil
		}
	}
}

// storeErr describes an error of op on rt from etcd (or from waiting for
// this edge's lease).
func (r *Router) storeErr(op string, rt router.Route, err error) error {
	if err == errClosed {
		return err
	}
	return fmt.Errorf("etcdrouter: %s %s %s: %w", op, rt.Proto, rt.Name, err)
}

// pendingUnbind is a route of this edge whose Unbind failed, to retry.
type pendingUnbind struct {
	route  router.Route
	until  time.Time // the end of its reservation; zero: none
	before int64     // the route to remove was created at this revision or earlier
}
