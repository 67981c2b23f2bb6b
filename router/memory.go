package router

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemoryRouter is the in-memory Router an edge uses when none is set: a
// router.Table per protocol for lookups, and an index of names by owner
// for the ownership rules. It keeps the operator's reservations too
// (Reserver), in memory. Its zero value is ready to use. A Bind or Unbind
// costs the same however many names it holds (but for the number of
// labels of the name); lookups take no lock.
type MemoryRouter struct {
	// Clock is the router's clock for when reservations lapse. Nil:
	// time.Now. It is for tests; an edge's own in-memory router takes
	// the edge's (edge.Server.Clock).
	Clock func() time.Time

	mu        sync.Mutex
	endpoints map[endpointKey]*endpoint
	owners    map[string]*owner         // by namespace and base: "host:abc.example.test"
	below     map[string]map[string]int // by namespace and base: identity -> bases under it that identity holds
	lapses    reservationHeap           // reservations by the time they lapse
	reserved  map[string]string         // the operator's reservations (rule 6): identity by name
	revoked   map[string]time.Time      // the identities revoked (Revoker), until when
	reservedN map[string]int            // the operator's reservations by identity: how many
	tables    sync.Map                  // proto to *Table[Route]
	watchers  map[*RouteFeed]struct{}
	// paths are the paths of each protocol and pattern with an endpoint.
	paths map[nameKey]map[string]struct{}
}

// endpointKey is the pattern and path of a protocol that routes and pools
// share.
type endpointKey struct{ proto, name, path string }

// nameKey is a protocol and pattern, whatever the path.
type nameKey struct{ proto, name string }

func (k endpointKey) nameKey() nameKey { return nameKey{k.proto, k.name} }

// endpoint is the routes of one protocol, pattern and path, all of one
// identity, or its reservation once they are gone.
type endpoint struct {
	identity string
	pool     bool   // its routes asked to share it
	policy   string // the traffic policy of its routes (rule 3)
	strip    bool   // its routes' StripPrefix (rule 3)
	routes   routeSet
	until    time.Time // reserved until, when it has no routes
	gen      uint64    // bumped at each reservation, to spot stale heap entries
}

// routeSet is the routes of an endpoint: nearly always one, several for a
// pool. A slice costs a route each, where a map's first entry takes room
// for eight (1.5 KiB); past indexAt routes, an index keeps a bind or an
// unbind of a large pool from scanning it.
type routeSet struct {
	list  []Route
	index map[RouteKey]int // position in list; nil up to indexAt routes
}

const indexAt = 8

func (s *routeSet) len() int { return len(s.list) }

func (s *routeSet) find(k RouteKey) int {
	if s.index != nil {
		if i, ok := s.index[k]; ok {
			return i
		}
		return -1
	}
	for i := range s.list {
		if s.list[i].Key() == k {
			return i
		}
	}
	return -1
}

func (s *routeSet) get(k RouteKey) (Route, bool) {
	if i := s.find(k); i >= 0 {
		return s.list[i], true
	}
	return Route{}, false
}

// add adds r, whose key s does not hold.
func (s *routeSet) add(r Route) {
	s.list = append(s.list, r)
	switch {
	case s.index != nil:
		s.index[r.Key()] = len(s.list) - 1
	case len(s.list) > indexAt:
		s.index = make(map[RouteKey]int, len(s.list))
		for i := range s.list {
			s.index[s.list[i].Key()] = i
		}
	}
}

// remove removes the route of key k and returns it, if s holds it.
func (s *routeSet) remove(k RouteKey) (Route, bool) {
	i := s.find(k)
	if i < 0 {
		return Route{}, false
	}
	r := s.list[i]
	last := len(s.list) - 1
	s.list[i] = s.list[last]
	s.list[last] = Route{}
	s.list = s.list[:last]
	if s.index != nil {
		delete(s.index, k)
		if i < last {
			s.index[s.list[i].Key()] = i
		}
	}
	if last == 0 {
		s.list, s.index = nil, nil // a reserved endpoint holds no route's room
	}
	return r, true
}

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

func (m *MemoryRouter) table(proto string) *Table[Route] {
	if t, ok := m.tables.Load(proto); ok {
		return t.(*Table[Route])
	}
	t, _ := m.tables.LoadOrStore(proto, new(Table[Route]))
	return t.(*Table[Route])
}

func (m *MemoryRouter) clock() time.Time {
	if m.Clock != nil {
		return m.Clock()
	}
	return time.Now()
}

// Bind implements Router.
func (m *MemoryRouter) Bind(_ context.Context, r Route) error {
	return m.bind(r, "")
}

// Move implements Mover.
func (m *MemoryRouter) Move(_ context.Context, r Route, from string) error {
	return m.bind(r, from)
}

// bind binds r, in the place of the routes of r's name that the session
// from holds, if from is not empty (see Mover).
func (m *MemoryRouter) bind(r Route, from string) error {
	name, ok := NormalisePattern(r.Name)
	if !ok {
		return fmt.Errorf("router: %w: %q", ErrInvalidName, r.Name)
	}
	path, err := RoutePath(r)
	if err != nil {
		return err
	}
	r.Name, r.Path = name, path
	ns, base := namespace(r.Proto), strings.TrimPrefix(name, "*.")
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	if err := m.checkOwnerLocked(ns, base, r.Identity); err != nil {
		return err
	}
	k := endpointKey{r.Proto, name, path}
	ep := m.endpoints[k]
	var moved []Route // the routes r takes the place of
	others := 0       // and the others
	if ep != nil {
		if _, dup := ep.routes.get(r.Key()); dup {
			return nil
		}
		for _, o := range ep.routes.list {
			if from != "" && o.SessionID == from {
				moved = append(moved, o)
			} else {
				others++
			}
		}
	}
	if others > 0 {
		what := r.Proto + " " + name + path
		if !ep.pool {
			return fmt.Errorf("%w: %s is bound already and not shared (its agent did not ask for a pool)", ErrNameTaken, what)
		}
		if !r.Pool {
			return fmt.Errorf("%w: %s is a pool: bind with pool to join it", ErrNameTaken, what)
		}
		if r.Policy != ep.policy {
			return fmt.Errorf("%w: %s is a pool with another traffic policy: its agents must declare the same one", ErrNameTaken, what)
		}
		if r.StripPrefix != ep.strip {
			return fmt.Errorf("%w: %s is a pool whose agents %s its path prefix: its agents must agree", ErrNameTaken, what, stripWord(ep.strip))
		}
	}
	// r goes in before the routes it replaces go out: lookups, which
	// take no lock, find the one or the other.
	if err := m.table(r.Proto).AddAt(name, path, r); err != nil {
		return err
	}
	if ep == nil {
		ep = m.newEndpointLocked(k, base, r.Identity)
	}
	if others == 0 {
		ep.pool, ep.policy, ep.strip, ep.until = r.Pool, r.Policy, r.StripPrefix, time.Time{}
	}
	ep.routes.add(r)
	m.notifyLocked(r, true)
	for _, o := range moved {
		ep.routes.remove(o.Key())
		m.table(r.Proto).RemoveAt(name, path, o)
		m.notifyLocked(o, false)
	}
	return nil
}

// stripWord says what the agents of a pool that strip (or not) its path
// prefix do, for a refusal.
func stripWord(strip bool) string {
	if strip {
		return "strip"
	}
	return "do not strip"
}

// newEndpointLocked adds the endpoint k, of identity, whose name has base,
// without routes yet.
func (m *MemoryRouter) newEndpointLocked(k endpointKey, base, identity string) *endpoint {
	ep := &endpoint{identity: identity}
	if m.endpoints == nil {
		m.endpoints = map[endpointKey]*endpoint{}
	}
	m.endpoints[k] = ep
	if m.paths == nil {
		m.paths = map[nameKey]map[string]struct{}{}
	}
	paths := m.paths[k.nameKey()]
	if paths == nil {
		paths = map[string]struct{}{}
		m.paths[k.nameKey()] = paths
	}
	paths[k.path] = struct{}{}
	m.holdLocked(namespace(k.proto), base, identity)
	return ep
}

// reserveLocked keeps the endpoint k, which has no routes, reserved
// until then.
func (m *MemoryRouter) reserveLocked(k endpointKey, ep *endpoint, until time.Time) {
	ep.until = until
	ep.gen++
	heap.Push(&m.lapses, lapse{k, ep.gen, until})
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
	name, ok := NormalisePattern(r.Name)
	if !ok {
		return nil
	}
	path, err := RoutePath(r)
	if err != nil {
		return nil
	}
	k := endpointKey{r.Proto, name, path}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	ep := m.endpoints[k]
	if ep == nil {
		return nil
	}
	stored, ok := ep.routes.remove(r.Key())
	if !ok {
		return nil
	}
	m.table(r.Proto).RemoveAt(name, path, stored)
	m.notifyLocked(stored, false)
	if ep.routes.len() > 0 {
		return nil
	}
	if reserve > 0 {
		m.reserveLocked(k, ep, m.clock().Add(reserve))
		return nil
	}
	m.dropLocked(k)
	return nil
}

// Reserve reserves r's name (its Proto and Name) for r.Identity for d, as
// Unbind of the name's last route with that reserve would (rule 4 of
// Router): an edge restores so, after a restart, the names held when it
// stopped. It fails with an error wrapping ErrNameTaken where Bind of r
// would, under the ownership rules. A name r.Identity holds already keeps
// its routes, or the later of its two reservations. A d of zero or less
// reserves nothing.
func (m *MemoryRouter) Reserve(_ context.Context, r Route, d time.Duration) error {
	name, ok := NormalisePattern(r.Name)
	if !ok {
		return fmt.Errorf("router: %w: %q", ErrInvalidName, r.Name)
	}
	path, err := RoutePath(r)
	if err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	ns, base := namespace(r.Proto), strings.TrimPrefix(name, "*.")
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	if err := m.checkOwnerLocked(ns, base, r.Identity); err != nil {
		return err
	}
	k := endpointKey{r.Proto, name, path}
	until := m.clock().Add(d)
	ep := m.endpoints[k]
	switch {
	case ep == nil:
		ep = m.newEndpointLocked(k, base, r.Identity)
	case ep.routes.len() > 0 || !until.After(ep.until):
		return nil
	}
	m.reserveLocked(k, ep, until)
	return nil
}

// Holder reports who holds the name of proto (a pattern, as Route.Name)
// now, under any path: the identity, and until when a reservation keeps
// it for them, which is zero while the name has routes. ok is false when
// nobody holds it.
func (m *MemoryRouter) Holder(proto, name string) (identity string, until time.Time, ok bool) {
	name, valid := NormalisePattern(name)
	if !valid {
		return "", time.Time{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	for path := range m.paths[nameKey{proto, name}] {
		ep := m.endpoints[endpointKey{proto, name, path}]
		if ep.routes.len() > 0 {
			return ep.identity, time.Time{}, true
		}
		identity, ok = ep.identity, true
		if ep.until.After(until) {
			until = ep.until
		}
	}
	return identity, until, ok
}

// dropLocked forgets an endpoint without routes.
func (m *MemoryRouter) dropLocked(k endpointKey) {
	delete(m.endpoints, k)
	if paths := m.paths[k.nameKey()]; paths != nil {
		delete(paths, k.path)
		if len(paths) == 0 {
			delete(m.paths, k.nameKey())
		}
	}
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
		if ep := m.endpoints[l.key]; ep != nil && ep.gen == l.gen && ep.routes.len() == 0 {
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

// LookupPath implements PathRouter.
func (m *MemoryRouter) LookupPath(_ context.Context, proto, host, path string) ([]Route, error) {
	var out []Route
	for r := range m.table(proto).BackendsAt(host, path) {
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
		now = append(now, ep.routes.list...)
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

var (
	_ Reserver   = (*MemoryRouter)(nil)
	_ PathRouter = (*MemoryRouter)(nil)
)

// AddReservation implements Reserver: the name counts as one more
// endpoint of its identity on its base, with no end.
func (m *MemoryRouter) AddReservation(_ context.Context, r Reservation) error {
	name, ok := Normalise(r.Name)
	if !ok || r.Identity == "" {
		return fmt.Errorf("router: %w: reservation of %q for %q", ErrInvalidName, r.Name, r.Identity)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	if m.reserved[name] == r.Identity {
		return nil
	}
	if err := m.checkOwnerLocked("host:", name, r.Identity); err != nil {
		return err
	}
	if m.reserved == nil {
		m.reserved, m.reservedN = map[string]string{}, map[string]int{}
	}
	m.reserved[name] = r.Identity
	m.reservedN[r.Identity]++
	m.holdLocked("host:", name, r.Identity)
	return nil
}

// RemoveReservation implements Reserver.
func (m *MemoryRouter) RemoveReservation(_ context.Context, name string) error {
	n, _ := Normalise(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.reserved[n]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoReservation, name)
	}
	delete(m.reserved, n)
	if m.reservedN[id]--; m.reservedN[id] == 0 {
		delete(m.reservedN, id)
	}
	m.releaseLocked("host:", n)
	return nil
}

// Reservation implements Reserver.
func (m *MemoryRouter) Reservation(_ context.Context, name string) (Reservation, bool, error) {
	n, _ := Normalise(name)
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.reserved[n]
	return Reservation{Name: n, Identity: id}, ok, nil
}

// Reservations implements Reserver.
func (m *MemoryRouter) Reservations(context.Context) ([]Reservation, error) {
	m.mu.Lock()
	out := make([]Reservation, 0, len(m.reserved))
	for name, id := range m.reserved {
		out = append(out, Reservation{Name: name, Identity: id})
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Reservation) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
