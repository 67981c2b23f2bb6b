// Table: a routing table from host names to pools of backends, the lookup
// structure under MemoryRouter and any Router that keeps a local cache.

package router

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/smallmap"
	"github.com/tunnelkit/tunnelkit/internal/urlpath"
)

// DefaultCooldown is how long a failed backend is skipped when
// [Table.Cooldown] is zero.
const DefaultCooldown = 10 * time.Second

// MaxCooldownFactor bounds how many times its Cooldown a backend that
// keeps failing is skipped for: 32, which is 5m20s of the default.
const MaxCooldownFactor = 32

// ErrInvalidName is returned by [Table.Add] for a name that is neither a host
// name nor a wildcard of the form "*.<host name>".
var ErrInvalidName = errors.New("router: invalid name")

// Table maps names, and path prefixes under them, to pools of backends.
// Its zero value is an empty table ready to use. A Table must not be
// copied after first use.
type Table[B comparable] struct {
	// Cooldown is how long a backend reported with Fail is skipped while
	// another backend of the same name is available; each Fail in a row
	// (no Succeed between) doubles it, up to MaxCooldownFactor times, so
	// that a backend that stays down is tried again ever more rarely.
	// Zero means DefaultCooldown; negative means failed backends are
	// never skipped.
	Cooldown time.Duration

	// now returns the current time; nil means time.Now. Tests set it.
	now func() time.Time

	mu sync.Mutex // serialises writers, and Names against them

	// Readers load from these maps without a lock; only writers, holding
	// mu, store to them.
	exact syncMap[string, *site[B]] // key: normalised host name
	wild  syncMap[string, *site[B]] // key: "example.test" for "*.example.test"
	// members holds one health record per distinct backend, shared by every
	// pool that contains it, so a backend that fails is skipped under every
	// name.
	members syncMap[B, *member[B]]
}

// site is the pools of one pattern: that of its backends without a path,
// which it holds itself (a name without paths costs no more than a pool),
// and one for each path prefix. Like a pool, it is never modified once
// stored in the table: a writer stores a new site in its place.
type site[B comparable] struct {
	pool[B]               // the backends without a path; none: no members
	pattern string        // the normalised name or wildcard it is the site of
	paths   *sitePaths[B] // nil: none
}

// sitePaths is the pools of a site's path prefixes.
type sitePaths[B comparable] struct {
	pools map[string]*pool[B] // by path prefix ("/api")
	order []string            // the keys of pools, sorted
	lens  pathLens            // the lengths of the keys of pools
}

// pathLens is a set of lengths of path prefixes, 0 to MaxPathBytes: a
// lookup asks for the parts of a path that have one of them only.
type pathLens [MaxPathBytes/64 + 1]uint64

func (l *pathLens) add(n int)      { l[n/64] |= 1 << (n % 64) }
func (l *pathLens) has(n int) bool { return n <= MaxPathBytes && l[n/64]&(1<<(n%64)) != 0 }

// root returns the pool of the backends without a path, or nil.
func (s *site[B]) root() *pool[B] {
	if s == nil || len(s.members) == 0 {
		return nil
	}
	return &s.pool
}

// poolAt returns the pool of path ("" for the backends without one), or nil.
func (s *site[B]) poolAt(path string) *pool[B] {
	switch {
	case s == nil:
		return nil
	case path == "":
		return s.root()
	case s.paths == nil:
		return nil
	}
	return s.paths.pools[path]
}

// with returns a site of pattern like s (nil: an empty one) but for the
// pool of path, which is p (nil: none); nil when it is left with no pool.
func (s *site[B]) with(pattern, path string, p *pool[B]) *site[B] {
	n := &site[B]{pattern: pattern}
	root := s.root()
	if s != nil {
		n.paths = s.paths
	}
	if path == "" {
		root = p
	} else {
		pools := map[string]*pool[B]{}
		if s != nil && s.paths != nil {
			for k, v := range s.paths.pools {
				pools[k] = v
			}
		}
		delete(pools, path)
		if p != nil {
			pools[path] = p
		}
		n.paths = nil
		if len(pools) > 0 {
			sp := &sitePaths[B]{pools: pools}
			for k := range pools {
				sp.order = append(sp.order, k)
				sp.lens.add(len(k))
			}
			slices.Sort(sp.order)
			n.paths = sp
		}
	}
	if root != nil {
		n.members = root.members
		n.next.Store(root.next.Load())
	}
	if len(n.members) == 0 && n.paths == nil {
		return nil
	}
	return n
}

// match returns the pool of the longest path prefix of s that path, a
// path as CleanPath returns it, is under; else the pool without a path.
// It tries only the parts of path that end a segment and have the length
// of a prefix of s: a long path costs a scan of its first MaxPathBytes
// bytes, and a map lookup for each of them that could match.
func (s *site[B]) match(path string) *pool[B] {
	sp := s.paths
	if sp == nil {
		return s.root()
	}
	j := len(path)
	if j > MaxPathBytes {
		j = MaxPathBytes
		if path[j] != '/' {
			j = strings.LastIndexByte(path[:j], '/')
		}
	}
	for j > 0 {
		if sp.lens.has(j) {
			if p, ok := sp.pools[path[:j]]; ok {
				return p
			}
		}
		j = strings.LastIndexByte(path[:j], '/')
	}
	return s.root()
}

// first returns the pool Backends starts with: the one without a path,
// else that of the first path.
func (s *site[B]) first() *pool[B] {
	if r := s.root(); r != nil || s.paths == nil {
		return r
	}
	return s.paths.pools[s.paths.order[0]]
}

// pool is the backends of one pattern and path. It is never modified once
// stored in the table: a writer stores a new pool (in a new site) in its
// place.
type pool[B comparable] struct {
	members []*member[B]
	next    atomic.Uint64 // round-robin cursor
}

func (p *pool[B]) has(b B) bool {
	return p != nil && slices.ContainsFunc(p.members, func(m *member[B]) bool { return m.b == b })
}

type member[B comparable] struct {
	b         B
	downUntil atomic.Int64 // unix nanoseconds; zero or past means healthy
	fails     atomic.Int32 // Fail calls since the last Succeed

	// places are the patterns and paths whose pools hold b (most often
	// one), as place returns them. Only writers use it, holding Table.mu.
	places smallmap.Map[string, struct{}]
}

// place is where a pool is: its pattern, then its path. A pattern holds
// no "/", and a path starts with one.
func place(pattern, path string) string { return pattern + path }

// splitPlace returns the pattern and the path of a place.
func splitPlace(p string) (pattern, path string) {
	if i := strings.IndexByte(p, '/'); i >= 0 {
		return p[:i], p[i:]
	}
	return p, ""
}

// Add adds backend b to the pool of name, a host name or a wildcard such as
// "*.example.test". Adding a backend already in the pool does nothing.
func (t *Table[B]) Add(name string, b B) error { return t.AddAt(name, "", b) }

// AddAt adds backend b to the pool of path under name: the pool of the
// requests for name whose path is path or under it (see BackendsAt). path
// is a path prefix as NormalisePath takes it; "" (or "/") is the pool of
// name itself, that Add adds to. Adding a backend already in the pool does
// nothing. It fails with an error wrapping ErrInvalidName for a name
// Add refuses, and ErrInvalidPath for a path NormalisePath refuses.
func (t *Table[B]) AddAt(name, path string, b B) error {
	pattern, path, err := normaliseKeys(name, path)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	names, key := t.namesOf(pattern)
	s, _ := names.load(key)
	old := s.poolAt(path)
	if old.has(b) {
		return nil
	}
	m, _ := t.members.load(b)
	if m == nil {
		m = &member[B]{b: b}
		t.members.store(b, m)
	}
	m.places.Set(place(pattern, path), struct{}{})
	p := &pool[B]{}
	if old != nil {
		p.members = append(slices.Clip(old.members), m)
		p.next.Store(old.next.Load())
	} else {
		p.members = []*member[B]{m}
	}
	names.store(key, s.with(pattern, path, p))
	return nil
}

// Remove removes backend b from the pool of name and reports whether it was
// there. A name whose pool becomes empty is removed.
func (t *Table[B]) Remove(name string, b B) bool { return t.RemoveAt(name, "", b) }

// RemoveAt removes backend b from the pool of path under name (see AddAt)
// and reports whether it was there. A pool left empty is removed, and so
// is a name left with no pool.
func (t *Table[B]) RemoveAt(name, path string, b B) bool {
	pattern, path, err := normaliseKeys(name, path)
	if err != nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.site(pattern).poolAt(path); !p.has(b) {
		return false
	}
	t.removeFrom(pattern, path, b)
	m, _ := t.members.load(b)
	m.places.Delete(place(pattern, path))
	if m.places.Len() == 0 {
		t.members.delete(b) // no pool holds b: forget its health
	}
	return true
}

// RemoveBackend removes b from every name and path and returns how many
// pools it was removed from. A tunnel edge calls it when an agent's
// session ends.
func (t *Table[B]) RemoveBackend(b B) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, _ := t.members.load(b)
	if m == nil {
		return 0
	}
	for pl := range m.places.All() {
		pattern, path := splitPlace(pl)
		t.removeFrom(pattern, path, b)
	}
	t.members.delete(b)
	return m.places.Len()
}

// removeFrom replaces the pool of pattern and path, which holds b, with
// one without b, or removes it when that leaves it empty (and pattern,
// when that leaves it no pool). t.mu must be held.
func (t *Table[B]) removeFrom(pattern, path string, b B) {
	names, key := t.namesOf(pattern)
	s, _ := names.load(key)
	old := s.poolAt(path)
	rest := slices.DeleteFunc(slices.Clone(old.members), func(m *member[B]) bool { return m.b == b })
	var p *pool[B]
	if len(rest) > 0 {
		p = &pool[B]{members: rest}
		p.next.Store(old.next.Load())
	}
	if s = s.with(pattern, path, p); s == nil {
		names.delete(key)
		return
	}
	names.store(key, s)
}

// Match returns the pattern that name is routed by: name itself normalised,
// or the wildcard that covers it. ok is false when no route matches.
func (t *Table[B]) Match(name string) (pattern string, ok bool) {
	s := t.lookup(name)
	if s == nil {
		return "", false
	}
	return s.pattern, true
}

// Has reports whether any route matches name.
func (t *Table[B]) Has(name string) bool {
	return t.lookup(name) != nil
}

// Backends returns the backends routed to name, in the order to try them:
// starting at the pool's round-robin cursor (which each call advances), the
// healthy backends first, then those in cooldown as a last resort. The
// sequence is empty when no route matches. Report a backend that could not be
// reached with Fail, then take the next one from the sequence. Of a name
// with path prefixes (AddAt), it yields the backends without a path first,
// then those of each path in turn, in the order of the paths: a request's
// backends are BackendsAt's.
func (t *Table[B]) Backends(name string) iter.Seq[B] {
	s := t.lookup(name)
	return func(yield func(B) bool) {
		if s == nil || !t.yieldPool(s.root(), yield) || s.paths == nil {
			return
		}
		for _, path := range s.paths.order {
			if !t.yieldPool(s.paths.pools[path], yield) {
				return
			}
		}
	}
}

// BackendsAt returns the backends routed to a request for name whose path,
// as CleanPath returns it, is path: those of the longest path prefix of
// name's pattern (AddAt) that path is under, on segment boundaries ("/api"
// takes "/api", "/api/" and "/api/x", never "/apix"), else those without a
// path; in the order to try them, as Backends yields a pool's. The
// sequence is empty when no route matches name, or none of its pattern
// takes path. A lookup costs the same whatever the number of paths.
func (t *Table[B]) BackendsAt(name, path string) iter.Seq[B] {
	var p *pool[B]
	if s := t.lookup(name); s != nil {
		p = s.match(path)
	}
	return func(yield func(B) bool) { t.yieldPool(p, yield) }
}

// yieldPool yields the backends of p (none for nil) in the order to try
// them, and reports whether yield asked for more.
func (t *Table[B]) yieldPool(p *pool[B], yield func(B) bool) bool {
	if p == nil {
		return true
	}
	n := uint64(len(p.members))
	start := p.next.Add(1) - 1
	now := t.clock().UnixNano()
	var skipped []*member[B]
	for i := range n {
		m := p.members[(start+i)%n]
		if m.downUntil.Load() > now {
			skipped = append(skipped, m)
			continue
		}
		if !yield(m.b) {
			return false
		}
	}
	for _, m := range skipped {
		if !yield(m.b) {
			return false
		}
	}
	return true
}

// Next returns the first backend Backends(name) would yield, advancing the
// round-robin cursor the same way. It does not allocate.
func (t *Table[B]) Next(name string) (b B, ok bool) {
	s := t.lookup(name)
	if s == nil {
		return b, false
	}
	p := s.first()
	n := uint64(len(p.members))
	start := p.next.Add(1) - 1
	now := t.clock().UnixNano()
	for i := range n {
		if m := p.members[(start+i)%n]; m.downUntil.Load() <= now {
			return m.b, true
		}
	}
	return p.members[start%n].b, true
}

// Fail reports that b could not be reached. Lookups skip it for the cooldown
// while another backend of the same name is healthy; each time it fails
// again once its cooldown ended, without a Succeed between, the next
// cooldown is twice as long, up to MaxCooldownFactor times the Cooldown.
// A Fail during a cooldown (a request that was under way when it began)
// changes nothing: one outage is one failure, however busy the name.
func (t *Table[B]) Fail(b B) {
	cd := t.Cooldown
	if cd < 0 {
		return
	}
	if cd == 0 {
		cd = DefaultCooldown
	}
	m, ok := t.members.load(b)
	if !ok {
		return
	}
	now := t.clock()
	for {
		until := m.downUntil.Load()
		if until > now.UnixNano() {
			return
		}
		n := m.fails.Load() + 1
		if n > maxDoublings+1 {
			n = maxDoublings + 1
		}
		if m.downUntil.CompareAndSwap(until, now.Add(cd*time.Duration(1<<(n-1))).UnixNano()) {
			m.fails.Store(n)
			return
		}
	}
}

// maxDoublings is how many times a cooldown doubles: 2^5 = MaxCooldownFactor.
const maxDoublings = 5

// Succeed reports that b was reached, ending any cooldown early, and the
// doubling of the next.
func (t *Table[B]) Succeed(b B) {
	if m, ok := t.members.load(b); ok && m.downUntil.Load() != 0 {
		m.downUntil.Store(0)
		m.fails.Store(0)
	}
}

// Names returns the routed names and wildcards, sorted.
func (t *Table[B]) Names() []string {
	var names []string
	t.mu.Lock() // a consistent view: no write half done
	for _, s := range t.exact.all() {
		names = append(names, s.pattern)
	}
	for _, s := range t.wild.all() {
		names = append(names, s.pattern)
	}
	t.mu.Unlock()
	slices.Sort(names)
	return names
}

// Pool returns the backends of the pattern name (an exact name or a
// wildcard, not resolved through wildcards) without a path, in pool order.
func (t *Table[B]) Pool(name string) []B { return t.PoolAt(name, "") }

// Paths returns the path prefixes of the pattern name that have a pool:
// "" first when the name has backends without a path, then the others,
// sorted.
func (t *Table[B]) Paths(name string) []string {
	pattern, err := normaliseKey(name)
	if err != nil {
		return nil
	}
	s := t.site(pattern)
	if s == nil {
		return nil
	}
	var out []string
	if s.root() != nil {
		out = append(out, "")
	}
	if s.paths != nil {
		out = append(out, s.paths.order...)
	}
	return out
}

// PoolAt returns the backends of path under the pattern name (see AddAt),
// in pool order.
func (t *Table[B]) PoolAt(name, path string) []B {
	pattern, path, err := normaliseKeys(name, path)
	if err != nil {
		return nil
	}
	p := t.site(pattern).poolAt(path)
	if p == nil {
		return nil
	}
	out := make([]B, len(p.members))
	for i, m := range p.members {
		out[i] = m.b
	}
	return out
}

func (t *Table[B]) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// namesOf returns the map that holds the site of a normalised pattern and
// its key there.
func (t *Table[B]) namesOf(pattern string) (*syncMap[string, *site[B]], string) {
	if host, ok := strings.CutPrefix(pattern, "*."); ok {
		return &t.wild, host
	}
	return &t.exact, pattern
}

// site returns the site of a normalised pattern, or nil.
func (t *Table[B]) site(pattern string) *site[B] {
	names, key := t.namesOf(pattern)
	s, _ := names.load(key)
	return s
}

// lookup finds the site for name: the exact name, else the longest wildcard
// covering it. A wildcard "*.example.test" covers one or more labels in
// front of "example.test", never "example.test" itself.
func (t *Table[B]) lookup(name string) *site[B] {
	name, ok := Normalise(name)
	if !ok {
		return nil
	}
	if p, ok := t.exact.load(name); ok {
		return p
	}
	// Try "*.b.c" for "a.b.c", then "*.c". Wildcards are keyed without
	// their "*." so each key is a suffix of name: no key is built.
	for rest := name; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return nil
		}
		rest = rest[i+1:]
		if p, ok := t.wild.load(rest); ok {
			return p
		}
	}
}

// Normalise returns name as the table compares it: ASCII lower case, one
// trailing dot removed. ok is false when name is not a valid host name
// (letters, digits, '-' and '_' in labels of 1 to 63 bytes that neither
// start nor end with '-', at most 253 bytes in all).
func Normalise(name string) (string, bool) {
	name = strings.TrimSuffix(name, ".")
	if !validHost(name) {
		return "", false
	}
	return lowerASCII(name), true
}

// NormalisePattern is Normalise for the patterns a Table routes by: a host
// name, or a wildcard "*.<host name>".
func NormalisePattern(pattern string) (string, bool) {
	host, wild := strings.CutPrefix(pattern, "*.")
	n, ok := Normalise(host)
	if !ok {
		return "", false
	}
	if wild {
		return "*." + n, true
	}
	return n, true
}

func normaliseKey(name string) (string, error) {
	n, ok := NormalisePattern(name)
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	return n, nil
}

// normaliseKeys returns the keys of a pool: its normalised pattern and
// path.
func normaliseKeys(name, path string) (pattern, p string, err error) {
	if pattern, err = normaliseKey(name); err != nil {
		return "", "", err
	}
	if p, err = urlpath.Prefix(path); err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrInvalidPath, err)
	}
	return pattern, p, nil
}

func validHost(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 || s[i-1] == '-' {
				return false
			}
			label = 0
			continue
		case c == '-' && label == 0:
			return false
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0 && s[len(s)-1] != '-'
}

// lowerASCII lowercases s, returning s itself when it is already lower case.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}
