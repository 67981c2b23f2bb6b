// Package etcdrouter is an [router.Router] over etcd, for edges that share one
// name space: a name bound through one edge is owned cluster-wide, and every
// edge looks it up.
//
// Bind and Unbind decide the ownership rules of the router.Router contract in
// etcd transactions, against every route and reservation in the store,
// whichever edge bound them. Lookup never talks to etcd: each Router keeps a
// cache of every route, loaded at start and kept current by a watch. Each
// edge holds an etcd lease that its routes are attached to, so the routes of
// an edge that dies vanish within its lease's TTL; a reservation is attached
// to a lease of its own, so it outlives the edge that made it.
//
// Typical use, one Router per edge:
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"etcd1:2379", "etcd2:2379"}})
//	if err != nil {
//		return err
//	}
//	defer cli.Close()
//	rt, err := etcdrouter.New(ctx, etcdrouter.Config{Client: cli, Edge: "edge-1"})
//	if err != nil {
//		return err
//	}
//	defer rt.Close() // revokes the lease: this edge's routes vanish at once
//	srv := &edge.Server{ID: "edge-1", Router: rt /* ... */}
//
// The routes Lookup returns have Edge set to the ID of the edge that holds
// their agent's session, this edge's own included, so the edge's Server.ID
// must be Config.Edge: the edge stamps it on the routes it binds, and takes
// a route with another Edge for one to reach through another edge (see
// relay.Relay).
//
// While etcd cannot be reached, Lookup goes on answering from the cache,
// and Bind and Unbind fail when their ctx ends, with errors that do not
// wrap router.ErrNameTaken. When etcd is back, the watch resumes (or the
// cache is loaded again); if this edge's lease expired meanwhile, the
// Router grants a new one and binds this edge's routes again, under the
// ownership rules: a route whose name another owner took meanwhile is
// dropped, with a warning in the log.
//
// # Keys
//
// Under Config.Prefix, the entries of a pattern live under its namespace
// ("host" for http, https and tls; "tcp" for ports) and its base (the
// pattern without "*.") with its labels reversed, so that the entries of a
// name and of every name under it share a key prefix:
//
//	<prefix>host/test.example.abc./http/*.abc.example.test/r/<edge>/<session>/<tunnel>   a route
//	<prefix>host/test.example.abc./http/*.abc.example.test/reserved                       a reservation (rule 4)
//	<prefix>host/test.example.abc./https/abc.example.test/p/%2Fapi/r/<edge>/<session>/<tunnel>  a route of a path
//	<prefix>host/test.example.abc./https/abc.example.test/p/%2Fapi/reserved                      its reservation
//	<prefix>host/test.example.abc./!reserved                                              the operator's reservation (rule 6)
//	<prefix>tcp/20001./tcp/20001/r/<edge>/<session>/<tunnel>
//	<prefix>edges/<edge>                                                                  an edge of the cluster
//	<prefix>revoked/<identity>                                                            an identity revoked (router.Revoker), until its value
//
// Edge, session, tunnel and a route's path are path-escaped. A value is the
// route (or, for a reservation, its Proto, Name, Path and Identity) in
// JSON; an edge's value is its ID. The routes of a path (router.Route's
// Path) have keys of their own, under "p/", which an edge of a version
// before paths does not read: it routes none of their requests, rather
// than send them all to a path's app. Upgrade every edge before agents
// bind paths.
//
// # Members
//
// Each Router registers its edge under <prefix>edges/, attached to its
// lease, at New (and again under a new lease, if its lease expired): the
// edges there are the cluster's members, which IsMember reports
// ([router.MemberChecker]); a relay.Relay relays only for them. Whoever can
// write under the prefix can make an edge a member, or take routes: give
// the edges, and only them, access to etcd, with TLS client certificates
// (clientv3.Config.TLS) from a CA of their own, or etcd's users and roles.
//
// # Secrets
//
// A route's value holds its traffic policy (router.Route's Policy), with
// the policy's secrets: basic-auth passwords, OIDC client secrets, webhook
// secrets. Whoever reads the keys can use them, and whoever writes them can
// change what the edges let through: keep them to the edges, as above.
package etcdrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/router"
)

// Router is an [router.Router], [router.HealthReporter],
// [router.RouteWatcher], [router.Reserver] (with
// [router.ReservationCounter]), [router.Mover] and [router.Revoker] over
// etcd.
// Create one with New; it is safe for concurrent use.
type Router struct {
	client *clientv3.Client
	prefix string
	edge   string
	ttl    int64 // of this edge's lease, in seconds
	log    *slog.Logger

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines Close waits for
	once   sync.Once
	closed atomic.Bool

	lease leaseState

	// The cache: every route in the store. Lookups read tables without a
	// lock; mu serialises the writers and guards the fields after it.
	tables   atomic.Pointer[map[string]*router.Table[router.Route]] // by proto; replaced, never modified
	mu       sync.Mutex
	rev      int64         // the store revision the cache reflects
	revCh    chan struct{} // closed when rev advances
	watchers map[*router.RouteFeed]struct{}
	members  map[string]struct{} // the edges registered under the prefix
	reserved map[string]string   // the operator's reservations: identity by name

	// The routes bound through this Router, to bind again under a new
	// lease if this edge's lease expires, and those whose Unbind failed,
	// to retry. syncCh wakes the goroutine that does both.
	ownMu   sync.Mutex
	own     map[string]router.Route  // by key
	pending map[string]pendingUnbind // by key
	syncCh  chan struct{}            // buffered 1

	testHookLeaseLost func() // called when the lease is found gone, before a new one is granted
}

// Config configures a Router.
type Config struct {
	// Client is the etcd client the Router uses; required. Close does not
	// close it.
	Client *clientv3.Client
	// Prefix is the key prefix of the name space that the edges sharing
	// it all use. "" means "/tunnelkit/"; a "/" is appended if it does not
	// end with one.
	Prefix string
	// Edge is this edge's ID; required. Every route bound through this
	// Router is stored with Edge set to it and attached to this edge's
	// lease, and every edge sharing Prefix must have an ID of its own.
	Edge string
	// TTL is this edge's lease TTL: a dead edge's routes vanish within it.
	// It is rounded up to whole seconds (etcd may raise it to its minimum,
	// about 2 s with default settings). Zero or negative means
	// DefaultTTL.
	TTL time.Duration
	// Logger receives the Router's logs: a route dropped because another
	// owner took its name while this edge's lease had expired (Warn),
	// trouble reaching etcd (Info). Nil discards them.
	Logger *slog.Logger

	testHookLeaseLost func() // see Router.testHookLeaseLost
}

// DefaultPrefix is the key prefix when Config.Prefix is empty.
const DefaultPrefix = "/tunnelkit/"

// DefaultTTL is this edge's lease TTL when Config.TTL is zero. A lease that
// lapses takes every route of the edge with it, and the edge binds them all
// again: when etcd is slow to renew leases (etcd renews one only once it
// applied what it committed, and an edge's thousands of agents binding on
// the other edges at once delay that for seconds), a short TTL turns that
// moment into every edge losing its routes at once. At 10 s, edges lost
// theirs in the runs of bench/scale when one of four edges of 40,000 agents
// died; 30 s rides that out. Agents with their tickets take a dead edge's
// names over at once whatever the TTL: it bounds how long the names of
// agents that died with their edge answer "agent offline" rather than
// "no endpoint".
const DefaultTTL = 30 * time.Second

// opTimeout bounds each etcd call the Router makes on its own (keeping the
// lease, loading the cache, binding its routes again); revokeTimeout bounds
// Close's revocation of the lease.
const (
	opTimeout     = 5 * time.Second
	revokeTimeout = 5 * time.Second
)

// errClosed is returned by the methods of a closed Router.
var errClosed = fmt.Errorf("etcdrouter: %w", net.ErrClosed)

var (
	_ router.Router         = (*Router)(nil)
	_ router.HealthReporter = (*Router)(nil)
	_ router.RouteWatcher   = (*Router)(nil)
	_ router.MemberChecker  = (*Router)(nil)
	_ router.PathRouter     = (*Router)(nil)
)

// New grants this edge's lease, registers this edge as a member under it,
// loads every route and member under cfg.Prefix into the cache and starts
// keeping the lease alive and the cache current. ctx bounds the setup
// only.
func New(ctx context.Context, cfg Config) (*Router, error) {
	if cfg.Client == nil {
		return nil, errors.New("etcdrouter: Config.Client is nil")
	}
	if cfg.Edge == "" {
		return nil, errors.New("etcdrouter: Config.Edge is empty")
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		client:   cfg.Client,
		prefix:   prefix,
		edge:     cfg.Edge,
		ttl:      seconds(ttl),
		log:      log,
		revCh:    make(chan struct{}),
		watchers: map[*router.RouteFeed]struct{}{},
		members:  map[string]struct{}{},
		reserved: map[string]string{},
		own:      map[string]router.Route{},
		pending:  map[string]pendingUnbind{},
		syncCh:   make(chan struct{}, 1),

		testHookLeaseLost: cfg.testHookLeaseLost,
	}
	r.tables.Store(&map[string]*router.Table[router.Route]{})
	r.lease.changed = make(chan struct{})
	r.lease.bad = make(chan clientv3.LeaseID, 1)

	var g *clientv3.LeaseGrantResponse
	err := busyRetry(ctx, log, "granting this edge's lease", func() (err error) {
		g, err = r.client.Grant(ctx, r.ttl)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("etcdrouter: grant lease: %w", err)
	}
	fail := func(err error) (*Router, error) {
		rctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
		r.client.Revoke(rctx, g.ID)
		cancel()
		return nil, err
	}
	if err := busyRetry(ctx, log, "registering this edge", func() error { return r.register(ctx, g.ID) }); err != nil {
		return fail(err)
	}
	var rev int64
	err = busyRetry(ctx, log, "loading the routes", func() (err error) {
		rev, err = r.load(ctx)
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("etcdrouter: load routes: %w", err))
	}
	r.setLease(g.ID)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(3)
	go r.keepLease(g.ID)
	go r.keepCache(rev)
	go r.syncOwn(g.ID)
	return r, nil
}

// Close stops the Router's goroutines and waits for them (and so for a call
// of a WatchRoutes func in progress), then revokes this edge's lease, so
// that the routes bound through this Router vanish at once (reservations
// stay until they lapse). Afterwards Bind, Unbind and Lookup
// fail with an error wrapping net.ErrClosed. Close is idempotent; only the
// first call reports an error, that of revoking the lease.
func (r *Router) Close() error {
	var err error
	r.once.Do(func() {
		r.mu.Lock()
		r.closed.Store(true)
		r.mu.Unlock()
		r.cancel()
		r.wg.Wait()
		r.stopWatches()
		if id := r.currentLease(); id != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
			defer cancel()
			if _, rerr := r.client.Revoke(ctx, id); rerr != nil {
				err = fmt.Errorf("etcdrouter: revoke lease: %w", rerr)
			}
		}
	})
	return err
}

// busyRetry runs op until it succeeds, fails otherwise than with etcd
// being too busy for now, or ctx ends. An edge started while etcd is
// swamped (the binds of a dead edge's thousands of agents, all at once)
// is told "too many requests" or "request timed out" until etcd catches
// up; it waits for that within its setup's time rather than exit.
func busyRetry(ctx context.Context, log *slog.Logger, what string, op func() error) error {
	var bo backoff
	for {
		err := op()
		if err == nil || !busy(err) || ctx.Err() != nil {
			return err
		}
		log.Info("etcdrouter: etcd is busy; trying again", "step", what, "err", err)
		if !bo.wait(ctx) {
			return err
		}
	}
}

// busy reports whether err is etcd saying it is too busy for now.
func busy(err error) bool {
	return errors.Is(err, rpctypes.ErrTooManyRequests) || errors.Is(err, rpctypes.ErrTimeout) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) || errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) ||
		errors.Is(err, rpctypes.ErrLeaderChanged) || errors.Is(err, rpctypes.ErrNoLeader)
}

// seconds rounds d up to whole seconds, at least one.
func seconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// backoff is the wait between attempts of a failing etcd call.
type backoff struct{ d time.Duration }

// next returns the wait before the next attempt.
func (b *backoff) next() time.Duration {
	b.d = min(max(2*b.d, 100*time.Millisecond), 2*time.Second)
	return b.d
}

// wait waits for the next attempt; false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (b *backoff) reset() { b.d = 0 }
