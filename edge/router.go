package edge

import (
	"container/heap"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// Route is an endpoint an agent bound: where public traffic for a name goes.
// It is plain data, so a Router can keep it in a shared store and a Dialer
// can reach an agent held by another edge.
type Route struct {
	Proto string // "http", "https", "tls" or "tcp"
	// Name is the public host name or wildcard of an HTTP or TLS endpoint
	// ("abc.example.test", "*.abc.example.test"), or the port of a TCP
	// endpoint in decimal ("20001").
	Name      string
	TunnelID  string // the endpoint within its session
	SessionID string // the agent session that bound it
	Identity  string // who owns Name: the agent's authenticated identity
	Edge      string // the edge holding the session; empty: this one
	// Pool asks Bind to add r beside the routes the same identity already
	// has for Name, rather than fail with ErrNameTaken.
	Pool bool
	// AppProtocol is what the edge speaks to the app of an http or https
	// route: "" for HTTP/1.1, "h2c" for HTTP/2 with prior knowledge.
	AppProtocol string
}

// Router decides where public traffic goes, and who owns which name. An
// edge calls Bind and Unbind as agents bind and release endpoints (and
// Unbind for each of a session's routes when it ends), and Lookup for every
// public connection or request. A control plane implements it against its
// own store; it must be safe for concurrent use. The package
// edge/routertest checks an implementation against this contract.
//
// Names. A route's Name is a host name pattern for the protocols that route
// by host name (http, https, tls): "abc.example.test", or a wildcard
// "*.abc.example.test" that matches one or more labels in front of
// abc.example.test. For tcp it is the port in decimal. A pattern's base is
// the pattern without its "*." prefix. Names are compared in lower case
// without a trailing dot.
//
// Ownership. Every route and every reservation belongs to an identity (the
// agent's authenticated identity, Route.Identity). Bind must decide these
// rules atomically, against every route and reservation in the store,
// whichever edge bound them:
//
//  1. One namespace for host names. http, https and tls share one
//     namespace: a host name has one owner whatever the protocol, and the
//     owner may hold it over several protocols at once. TCP ports are a
//     namespace of their own.
//  2. A name owns its tree. A pattern stands for its base and every name
//     under it. Bind of r fails with ErrNameTaken when a route or
//     reservation of another identity has a base equal to r's base, above
//     it (a suffix of it at a label boundary) or below it. So while A holds
//     "*.w.example.test", nobody else binds "x.w.example.test",
//     "w.example.test" or "*.x.w.example.test"; while A holds
//     "abc.example.test", nobody else binds "*.abc.example.test" or
//     "x.abc.example.test"; and A cannot bind "*.example.test" while B holds
//     "x.example.test". Within its own trees an identity binds freely. For
//     tcp, only the same port conflicts.
//  3. Pools by consent. When r's identity already has routes for the same
//     Proto and Name, Bind adds r beside them only when those routes and r
//     all have Pool set; otherwise it fails with ErrNameTaken, with a
//     message saying which side did not ask to share.
//  4. Reservations. Unbind(r, reserve) with reserve > 0, of the last route
//     of r.Proto and r.Name, leaves that name reserved for r.Identity for
//     reserve: it counts as held by r.Identity under rule 2, has no routes
//     (Lookup finds nothing), and r.Identity binds it again with or without
//     Pool, which ends the reservation. A lapsed reservation is gone.
//  5. Atomicity. Of Binds racing for conflicting names on behalf of
//     different identities, exactly one succeeds, every time.
//
// Lookup(proto, host) finds the routes of the most specific pattern of proto
// matching host (an exact name before any wildcard, a longer wildcard before
// a shorter one), in the order to try them: round robin over a pool, with
// routes reported as failing last.
//
// The edge, not the Router, decides which names are valid and may be asked
// for at all (under its domain; catch-all wildcards only when allowed), and
// the limits per session.
//
// A shared store can decide a Bind in one transaction: keep a key per
// namespace and base holding its owner, its labels reversed
// ("test.example.abc.") so that a tree is a key prefix; read the keys of the
// base's ancestors (one per label) and the range of its tree, check the
// rules, and write only if none of the keys read changed since (in etcd, one
// Txn comparing the ModRevision of each ancestor key and of the tree's
// prefix range with the revision read). A reservation is a key with a lease
// of its own, so that it outlives the edge that made it.
type Router interface {
	// Bind adds r, or fails with an error wrapping ErrNameTaken under the
	// ownership rules above. A route is known by its Proto, Name, Edge,
	// SessionID and TunnelID: binding one that is bound already does
	// nothing.
	Bind(ctx context.Context, r Route) error
	// Unbind removes the route with r's Proto, Name, Edge, SessionID and
	// TunnelID; removing an absent route is not an error. When it was the
	// last route of its Proto and Name and reserve is positive, the name
	// stays reserved for r.Identity for that long (rule 4).
	Unbind(ctx context.Context, r Route, reserve time.Duration) error
	// Lookup returns the routes for proto and host, in the order to try
	// them. No route is an empty slice and a nil error.
	Lookup(ctx context.Context, proto, host string) ([]Route, error)
}

// HealthReporter is implemented by Routers that want to hear how reaching
// a route's agent went, to try failing routes after the others: the edge
// calls Fail when its Dialer could not reach a route's agent, and Succeed
// each time it did. Both must be cheap (they are called on the request
// path, so a shared store's Router keeps this state locally) and safe for
// concurrent use.
type HealthReporter interface {
	Fail(Route)
	Succeed(Route)
}

// RouteWatcher is implemented by Routers shared between edges. WatchRoutes
// calls f with every route that exists when it is called (bound true), then
// with each route bound or unbound anywhere in the cluster afterwards, in
// order, from one goroutine at a time, until stop is called. An edge uses
// it to listen on the ports of TCP endpoints whose agents are held by other
// edges.
type RouteWatcher interface {
	WatchRoutes(f func(r Route, bound bool)) (stop func())
}

// MemoryRouter is the in-memory Router an edge uses when none is set: a
// router.Table per protocol for lookups, and an index of names by owner
// for the ownership rules. Its zero value is ready to use. A Bind or Unbind
// costs the same however many names it holds (but for the number of
// labels of the name); lookups take no lock.
type MemoryRouter struct {
	mu        sync.Mutex
	endpoints map[endpointKey]*endpoint
	owners    map[string]*owner         // by namespace and base: "host:abc.example.test"
	below     map[string]map[string]int // by namespace and base: identity -> bases under it that identity holds
	lapses    reservationHeap           // reservations by the time they lapse
	tables    sync.Map                  // proto to *router.Table[Route]
	now       func() time.Time          // nil: time.Now
	watchers  map[*RouteFeed]struct{}
}

// endpointKey is the pattern of a protocol that routes and pools share.
type endpointKey struct{ proto, name string }

// endpoint is the routes of one protocol and pattern, all of one identity,
// or its reservation once they are gone.
type endpoint struct {
	identity string
	pool     bool // its routes asked to share it
	routes   map[routeKey]Route
	until    time.Time // reserved until, when it has no routes
	gen      uint64    // bumped at each reservation, to spot stale heap entries
}

type routeKey struct{ edge, session, tunnel string }

func keyOf(r Route) routeKey { return routeKey{r.Edge, r.SessionID, r.TunnelID} }

// owner holds a base: the identity, and how many endpoints (live or
// reserved) have that base.
type owner struct {
	identity string
	refs     int
}

// namespace returns the ownership namespace of a protocol: host names for
// every protocol but tcp, whose names are ports.
func namespace(proto string) string {
	if proto == "tcp" {
		return "tcp:"
	}
	return "host:"
}

func (m *MemoryRouter) table(proto string) *router.Table[Route] {
	if t, ok := m.tables.Load(proto); ok {
		return t.(*router.Table[Route])
	}
	t, _ := m.tables.LoadOrStore(proto, new(router.Table[Route]))
	return t.(*router.Table[Route])
}

func (m *MemoryRouter) clock() time.Time {
	if m.now != nil {
		return m.now()
	}
	return time.Now()
}

// Bind implements Router.
func (m *MemoryRouter) Bind(_ context.Context, r Route) error {
	name, ok := router.NormalisePattern(r.Name)
	if !ok {
		return fmt.Errorf("edge: %w: %q", router.ErrInvalidName, r.Name)
	}
	r.Name = name
	ns, base := namespace(r.Proto), strings.TrimPrefix(name, "*.")
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	if err := m.checkOwnerLocked(ns, base, r.Identity); err != nil {
		return err
	}
	k := endpointKey{r.Proto, name}
	ep := m.endpoints[k]
	if ep != nil && len(ep.routes) > 0 {
		if _, dup := ep.routes[keyOf(r)]; dup {
			return nil
		}
		if !ep.pool {
			return fmt.Errorf("%w: %s %s is bound already and not shared (its agent did not ask for a pool)", ErrNameTaken, r.Proto, name)
		}
		if !r.Pool {
			return fmt.Errorf("%w: %s %s is a pool: bind with pool to join it", ErrNameTaken, r.Proto, name)
		}
	}
	if err := m.table(r.Proto).Add(name, r); err != nil {
		return err
	}
	if ep == nil {
		ep = &endpoint{identity: r.Identity, routes: map[routeKey]Route{}}
		if m.endpoints == nil {
			m.endpoints = map[endpointKey]*endpoint{}
		}
		m.endpoints[k] = ep
		m.holdLocked(ns, base, r.Identity)
	}
	if len(ep.routes) == 0 {
		ep.pool, ep.until = r.Pool, time.Time{}
	}
	ep.routes[keyOf(r)] = r
	m.notifyLocked(r, true)
	return nil
}

// checkOwnerLocked refuses a bind of base in ns by identity when another
// identity holds base, a name above it or a name below it.
func (m *MemoryRouter) checkOwnerLocked(ns, base, identity string) error {
	if o := m.owners[ns+base]; o != nil && o.identity != identity {
		return fmt.Errorf("%w: %s is held by another owner", ErrNameTaken, base)
	}
	if ns != "host:" {
		return nil
	}
	for a := range ancestors(base) {
		if o := m.owners[ns+a]; o != nil && o.identity != identity {
			return fmt.Errorf("%w: %s is under %s, held by another owner", ErrNameTaken, base, a)
		}
	}
	for id, n := range m.below[ns+base] {
		if id != identity && n > 0 {
			return fmt.Errorf("%w: names under %s are held by another owner", ErrNameTaken, base)
		}
	}
	return nil
}

// ancestors yields the names above a host name: "b.c" and "c" for "a.b.c".
func ancestors(name string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for rest := name; ; {
			i := strings.IndexByte(rest, '.')
			if i < 0 {
				return
			}
			rest = rest[i+1:]
			if !yield(rest) {
				return
			}
		}
	}
}

// holdLocked counts one more endpoint of identity on base.
func (m *MemoryRouter) holdLocked(ns, base, identity string) {
	if o := m.owners[ns+base]; o != nil {
		o.refs++
		return
	}
	if m.owners == nil {
		m.owners = map[string]*owner{}
		m.below = map[string]map[string]int{}
	}
	m.owners[ns+base] = &owner{identity: identity, refs: 1}
	if ns != "host:" {
		return
	}
	for a := range ancestors(base) {
		ids := m.below[ns+a]
		if ids == nil {
			ids = map[string]int{}
			m.below[ns+a] = ids
		}
		ids[identity]++
	}
}

// releaseLocked counts one endpoint less on base.
func (m *MemoryRouter) releaseLocked(ns, base string) {
	o := m.owners[ns+base]
	if o == nil {
		return
	}
	if o.refs--; o.refs > 0 {
		return
	}
	delete(m.owners, ns+base)
	if ns != "host:" {
		return
	}
	for a := range ancestors(base) {
		ids := m.below[ns+a]
		if ids[o.identity]--; ids[o.identity] <= 0 {
			delete(ids, o.identity)
		}
		if len(ids) == 0 {
			delete(m.below, ns+a)
		}
	}
}

// Unbind implements Router.
func (m *MemoryRouter) Unbind(_ context.Context, r Route, reserve time.Duration) error {
	name, ok := router.NormalisePattern(r.Name)
	if !ok {
		return nil
	}
	k := endpointKey{r.Proto, name}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	ep := m.endpoints[k]
	if ep == nil {
		return nil
	}
	stored, ok := ep.routes[keyOf(r)]
	if !ok {
		return nil
	}
	delete(ep.routes, keyOf(r))
	m.table(r.Proto).Remove(name, stored)
	m.notifyLocked(stored, false)
	if len(ep.routes) > 0 {
		return nil
	}
	if reserve > 0 {
		ep.until = m.clock().Add(reserve)
		ep.gen++
		heap.Push(&m.lapses, lapse{k, ep.gen, ep.until})
		return nil
	}
	m.dropLocked(k)
	return nil
}

// dropLocked forgets an endpoint without routes.
func (m *MemoryRouter) dropLocked(k endpointKey) {
	delete(m.endpoints, k)
	m.releaseLocked(namespace(k.proto), strings.TrimPrefix(k.name, "*."))
}

// expireLocked forgets the reservations that lapsed.
func (m *MemoryRouter) expireLocked() {
	if len(m.lapses) == 0 {
		return
	}
	now := m.clock()
	for len(m.lapses) > 0 && !m.lapses[0].until.After(now) {
		l := heap.Pop(&m.lapses).(lapse)
		if ep := m.endpoints[l.key]; ep != nil && ep.gen == l.gen && len(ep.routes) == 0 {
			m.dropLocked(l.key)
		}
	}
}

// lapse is when a reservation ends, unless its endpoint was bound again
// (its gen changed) meanwhile.
type lapse struct {
	key   endpointKey
	gen   uint64
	until time.Time
}

type reservationHeap []lapse

func (h reservationHeap) Len() int           { return len(h) }
func (h reservationHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h reservationHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *reservationHeap) Push(x any)        { *h = append(*h, x.(lapse)) }
func (h *reservationHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Lookup implements Router.
func (m *MemoryRouter) Lookup(_ context.Context, proto, host string) ([]Route, error) {
	var out []Route
	for r := range m.table(proto).Backends(host) {
		out = append(out, r)
	}
	return out, nil
}

// Fail marks r as failing: later lookups try it after the others.
func (m *MemoryRouter) Fail(r Route) { m.table(r.Proto).Fail(r) }

// Succeed ends r's failing mark.
func (m *MemoryRouter) Succeed(r Route) { m.table(r.Proto).Succeed(r) }

// WatchRoutes calls f with every route bound now, then with each route
// bound or unbound, in order, from a goroutine of its own, until stop is
// called (see RouteWatcher). Edges sharing one MemoryRouter in a process
// form a cluster this way.
func (m *MemoryRouter) WatchRoutes(f func(r Route, bound bool)) (stop func()) {
	m.mu.Lock()
	var now []Route
	for _, ep := range m.endpoints {
		for _, r := range ep.routes {
			now = append(now, r)
		}
	}
	w := NewRouteFeed(f, now)
	if m.watchers == nil {
		m.watchers = map[*RouteFeed]struct{}{}
	}
	m.watchers[w] = struct{}{}
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.watchers, w)
		m.mu.Unlock()
		w.Stop()
	}
}

func (m *MemoryRouter) notifyLocked(r Route, bound bool) {
	for w := range m.watchers {
		w.Push(r, bound)
	}
}
