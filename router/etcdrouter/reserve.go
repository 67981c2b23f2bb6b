package etcdrouter

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/router"
)

// The operator's reservations (rule 6 of router.Router): a key each, in
// the namespace of host names, beside the entries of the name it
// reserves, "<prefix>host/<reversed name>/!reserved" (no proto is "!", a
// path-escaped one has none), with no lease, so that it outlives every
// edge. Its value is the name and identity in JSON, as a reservation of
// rule 4's, with no proto. A Bind reads it with the name's tree and
// ancestors, as any entry of its owner; every Router caches them, for
// Reservations.

var _ router.Reserver = (*Router)(nil)

// reservedKey returns the key of the operator's reservation of name.
func (r *Router) reservedKey(name string) string {
	return r.prefix + "host/" + reversed(name) + "/!reserved"
}

// reservationOf returns the name whose operator's reservation key is.
func (r *Router) reservationOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, r.prefix+"host/")
	if !ok {
		return "", false
	}
	rev, ok := strings.CutSuffix(rest, "/!reserved")
	if !ok || strings.Contains(rev, "/") {
		return "", false
	}
	labels := strings.Split(strings.TrimSuffix(rev, "."), ".")
	slices.Reverse(labels)
	return router.Normalise(strings.Join(labels, "."))
}

// AddReservation implements [router.Reserver], in one etcd transaction per
// attempt as Bind does: it reads the entries of the name's tree and of the
// names above it at one revision, refuses any of another identity, and
// writes the reservation only if none of them changed since. When it
// returns nil, this Router's Reservations has it.
func (r *Router) AddReservation(ctx context.Context, res router.Reservation) error {
	if r.closed.Load() {
		return errClosed
	}
	name, ok := router.Normalise(res.Name)
	if !ok || res.Identity == "" {
		return fmt.Errorf("etcdrouter: %w: reservation of %q for %q", router.ErrInvalidName, res.Name, res.Identity)
	}
	k := r.keysOf(router.Route{Proto: "http", Name: name}) // its namespace is host names'
	value := encode(router.Route{Name: name, Identity: res.Identity})
	key := r.reservedKey(name)
	reads := []clientv3.Op{clientv3.OpGet(k.tree, clientv3.WithPrefix())}
	for _, a := range k.ancestors {
		reads = append(reads, clientv3.OpGet(a, clientv3.WithPrefix()))
	}
	for {
		resp, err := r.client.Txn(ctx).Then(reads...).Commit()
		if err != nil {
			return fmt.Errorf("etcdrouter: reserve %s: %w", name, err)
		}
		rev := resp.Header.Revision
		for i, op := range resp.Responses {
			for _, kv := range op.GetResponseRange().GetKvs() {
				e, err := decode(kv.Value)
				switch {
				case err != nil:
					return fmt.Errorf("etcdrouter: bad entry %q: %w", kv.Key, err)
				case e.Identity == res.Identity && string(kv.Key) == key:
					return r.await(ctx, kv.ModRevision) // reserved already
				case e.Identity == res.Identity:
				case i > 0:
					return fmt.Errorf("%w: %s is under %s, held by another owner", router.ErrNameTaken, name, k.above[i-1])
				case strings.HasPrefix(string(kv.Key), k.own):
					return fmt.Errorf("%w: %s is held by another owner", router.ErrNameTaken, name)
				default:
					return fmt.Errorf("%w: names under %s are held by another owner", router.ErrNameTaken, name)
				}
			}
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.tree), "<", rev+1).WithPrefix()}
		for _, a := range k.ancestors {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(a), "<", rev+1).WithPrefix())
		}
		w, err := r.client.Txn(ctx).If(cmps...).Then(clientv3.OpPut(key, value)).Commit()
		switch {
		case err != nil:
			return fmt.Errorf("etcdrouter: reserve %s: %w", name, err)
		case w.Succeeded:
			return r.await(ctx, w.Header.Revision)
		}
	}
}

// RemoveReservation implements [router.Reserver]. When it returns nil,
// this Router's Reservations no longer has it.
func (r *Router) RemoveReservation(ctx context.Context, name string) error {
	if r.closed.Load() {
		return errClosed
	}
	n, ok := router.Normalise(name)
	if !ok {
		return fmt.Errorf("%w: %q", router.ErrNoReservation, name)
	}
	key := r.reservedKey(n)
	w, err := r.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), ">", 0)).Then(clientv3.OpDelete(key)).Commit()
	switch {
	case err != nil:
		return fmt.Errorf("etcdrouter: unreserve %s: %w", n, err)
	case !w.Succeeded:
		return fmt.Errorf("%w: %q", router.ErrNoReservation, name)
	}
	return r.await(ctx, w.Header.Revision)
}

// Reservation implements [router.Reserver]: it asks etcd, so that a
// reservation made through another edge counts at once.
func (r *Router) Reservation(ctx context.Context, name string) (router.Reservation, bool, error) {
	if r.closed.Load() {
		return router.Reservation{}, false, errClosed
	}
	n, ok := router.Normalise(name)
	if !ok {
		return router.Reservation{}, false, nil
	}
	resp, err := r.client.Get(ctx, r.reservedKey(n))
	if err != nil {
		return router.Reservation{}, false, fmt.Errorf("etcdrouter: reservation of %s: %w", n, err)
	}
	if len(resp.Kvs) == 0 {
		return router.Reservation{}, false, nil
	}
	e, err := decode(resp.Kvs[0].Value)
	if err != nil {
		return router.Reservation{}, false, fmt.Errorf("etcdrouter: bad entry %q: %w", resp.Kvs[0].Key, err)
	}
	return router.Reservation{Name: n, Identity: e.Identity}, true, nil
}

// Reservations implements [router.Reserver] from the cache, without
// talking to etcd: the reservations made through this Router are there
// when their call returns, those of other edges once the watch brings
// them (at once, but for the network).
func (r *Router) Reservations(context.Context) ([]router.Reservation, error) {
	if r.closed.Load() {
		return nil, errClosed
	}
	r.mu.Lock()
	out := make([]router.Reservation, 0, len(r.reserved))
	for name, id := range r.reserved {
		out = append(out, router.Reservation{Name: name, Identity: id})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b router.Reservation) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

var _ router.ReservationCounter = (*Router)(nil)

// CountReservations implements [router.ReservationCounter] from the cache,
// as Reservations lists them.
func (r *Router) CountReservations(_ context.Context, identity string) (all, of int, err error) {
	if r.closed.Load() {
		return 0, 0, errClosed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.reserved {
		if id == identity {
			of++
		}
	}
	return len(r.reserved), of, nil
}

// cacheReservationLocked applies an event on key to the cache's
// reservations, and reports whether key is the key of one: value is the
// reservation, or nil when it went. r.mu is held.
func (r *Router) cacheReservationLocked(key string, value []byte) bool {
	name, ok := r.reservationOf(key)
	if !ok {
		return false
	}
	if value == nil {
		delete(r.reserved, name)
		return true
	}
	if e, err := decode(value); err == nil {
		r.reserved[name] = e.Identity
	}
	return true
}
