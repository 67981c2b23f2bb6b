// Package router is a routing table from host names to pools of backends.
//
// A [Table] maps exact names ("app.example.test") and wildcards
// ("*.example.test") to one or more backends of any comparable type: an
// address string for an L4 proxy, a session for a tunnel edge. Lookups are
// case-insensitive, ignore one trailing dot, prefer an exact name to a
// wildcard and a longer wildcard to a shorter one. Backends of a name are
// handed out round robin; a backend the caller reports as failed is skipped
// for [Table.Cooldown] and then tried again.
//
// Typical use, with failover past a backend that refuses:
//
//	var t router.Table[string]
//	t.Add("app.example.test", "127.0.0.1:9001")
//	t.Add("app.example.test", "127.0.0.1:9002")
//	for addr := range t.Backends("APP.example.test.") {
//		c, err := net.Dial("tcp", addr)
//		if err != nil {
//			t.Fail(addr) // skipped by later lookups for a while
//			continue
//		}
//		// use c
//		break
//	}
//
// Reads take no lock: the table is an immutable snapshot behind an atomic
// pointer, replaced as a whole by writers, which are serialised.
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
)

// DefaultCooldown is how long a failed backend is skipped when
// [Table.Cooldown] is zero.
const DefaultCooldown = 10 * time.Second

// ErrInvalidName is returned by [Table.Add] for a name that is neither a host
// name nor a wildcard of the form "*.<host name>".
var ErrInvalidName = errors.New("router: invalid name")

// Table maps names to pools of backends. Its zero value is an empty table
// ready to use. A Table must not be copied after first use.
type Table[B comparable] struct {
	// Cooldown is how long a backend reported with Fail is skipped while
	// another backend of the same name is available. Zero means
	// DefaultCooldown; negative means failed backends are never skipped.
	Cooldown time.Duration

	// now returns the current time; nil means time.Now. Tests set it.
	now func() time.Time

	mu   sync.Mutex // serialises writers
	snap atomic.Pointer[snapshot[B]]
}

// snapshot is an immutable view of the table. Writers copy it and swap it in.
type snapshot[B comparable] struct {
	names map[string]*pool[B] // key: normalised name, "*." prefix for wildcards
	// members holds one health record per distinct backend, shared by every
	// pool that contains it, so a backend that fails is skipped under every
	// name.
	members map[B]*member[B]
}

// pool is the backends of one name. Its slice is never modified in place.
type pool[B comparable] struct {
	pattern string // the key of this pool in snapshot.names
	members []*member[B]
	next    atomic.Uint64 // round-robin cursor
}

type member[B comparable] struct {
	b         B
	downUntil atomic.Int64 // unix nanoseconds; zero or past means healthy
}

// Add adds backend b to the pool of name, a host name or a wildcard such as
// "*.example.test". Adding a backend already in the pool does nothing.
func (t *Table[B]) Add(name string, b B) error {
	key, err := normaliseKey(name)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	if p := old.names[key]; p != nil && slices.ContainsFunc(p.members, func(m *member[B]) bool { return m.b == b }) {
		return nil
	}
	next := old.clone()
	m := next.members[b]
	if m == nil {
		m = &member[B]{b: b}
		next.members[b] = m
	}
	np := &pool[B]{pattern: key}
	if p := old.names[key]; p != nil {
		np.members = append(slices.Clip(p.members), m)
		np.next.Store(p.next.Load())
	} else {
		np.members = []*member[B]{m}
	}
	next.names[key] = np
	t.snap.Store(next)
	return nil
}

// Remove removes backend b from the pool of name and reports whether it was
// there. A name whose pool becomes empty is removed.
func (t *Table[B]) Remove(name string, b B) bool {
	key, err := normaliseKey(name)
	if err != nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	p := old.names[key]
	if p == nil || !slices.ContainsFunc(p.members, func(m *member[B]) bool { return m.b == b }) {
		return false
	}
	next := old.clone()
	next.setPool(key, p, b)
	next.dropUnused(b)
	t.snap.Store(next)
	return true
}

// RemoveBackend removes b from every name and returns how many names it was
// removed from. A tunnel edge calls it when an agent's session ends.
func (t *Table[B]) RemoveBackend(b B) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	if old.members[b] == nil {
		return 0
	}
	next := old.clone()
	n := 0
	for key, p := range old.names {
		if slices.ContainsFunc(p.members, func(m *member[B]) bool { return m.b == b }) {
			next.setPool(key, p, b)
			n++
		}
	}
	delete(next.members, b)
	t.snap.Store(next)
	return n
}

// setPool stores in s the pool p without backend b, or deletes key when that
// leaves it empty.
func (s *snapshot[B]) setPool(key string, p *pool[B], b B) {
	rest := slices.DeleteFunc(slices.Clone(p.members), func(m *member[B]) bool { return m.b == b })
	if len(rest) == 0 {
		delete(s.names, key)
		return
	}
	np := &pool[B]{pattern: key, members: rest}
	np.next.Store(p.next.Load())
	s.names[key] = np
}

// dropUnused forgets the health record of b when no pool holds it any more.
func (s *snapshot[B]) dropUnused(b B) {
	for _, p := range s.names {
		if slices.ContainsFunc(p.members, func(m *member[B]) bool { return m.b == b }) {
			return
		}
	}
	delete(s.members, b)
}

// Match returns the pattern that name is routed by: name itself normalised,
// or the wildcard that covers it. ok is false when no route matches.
func (t *Table[B]) Match(name string) (pattern string, ok bool) {
	key, p := t.load().lookup(name)
	return key, p != nil
}

// Has reports whether any route matches name.
func (t *Table[B]) Has(name string) bool {
	_, p := t.load().lookup(name)
	return p != nil
}

// Backends returns the backends routed to name, in the order to try them:
// starting at the pool's round-robin cursor (which each call advances), the
// healthy backends first, then those in cooldown as a last resort. The
// sequence is empty when no route matches. Report a backend that could not be
// reached with Fail, then take the next one from the sequence.
func (t *Table[B]) Backends(name string) iter.Seq[B] {
	_, p := t.load().lookup(name)
	return func(yield func(B) bool) {
		if p == nil {
			return
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
				return
			}
		}
		for _, m := range skipped {
			if !yield(m.b) {
				return
			}
		}
	}
}

// Next returns the first backend Backends(name) would yield, advancing the
// round-robin cursor the same way. It does not allocate.
func (t *Table[B]) Next(name string) (b B, ok bool) {
	_, p := t.load().lookup(name)
	if p == nil {
		return b, false
	}
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
// while another backend of the same name is healthy.
func (t *Table[B]) Fail(b B) {
	cd := t.Cooldown
	if cd < 0 {
		return
	}
	if cd == 0 {
		cd = DefaultCooldown
	}
	if m := t.load().members[b]; m != nil {
		m.downUntil.Store(t.clock().Add(cd).UnixNano())
	}
}

// Succeed reports that b was reached, ending any cooldown early.
func (t *Table[B]) Succeed(b B) {
	if m := t.load().members[b]; m != nil && m.downUntil.Load() != 0 {
		m.downUntil.Store(0)
	}
}

// Names returns the routed names and wildcards, sorted.
func (t *Table[B]) Names() []string {
	s := t.load()
	names := make([]string, 0, len(s.names))
	for k := range s.names {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Pool returns the backends of the pattern name (an exact name or a
// wildcard, not resolved through wildcards), in pool order.
func (t *Table[B]) Pool(name string) []B {
	key, err := normaliseKey(name)
	if err != nil {
		return nil
	}
	p := t.load().names[key]
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

func (t *Table[B]) load() *snapshot[B] {
	if s := t.snap.Load(); s != nil {
		return s
	}
	return &snapshot[B]{}
}

func (s *snapshot[B]) clone() *snapshot[B] {
	n := &snapshot[B]{
		names:   make(map[string]*pool[B], len(s.names)+1),
		members: make(map[B]*member[B], len(s.members)+1),
	}
	for k, v := range s.names {
		n.names[k] = v
	}
	for k, v := range s.members {
		n.members[k] = v
	}
	return n
}

// lookup finds the pool for name: the exact name, else the longest wildcard
// covering it. A wildcard "*.example.test" covers one or more labels in
// front of "example.test", never "example.test" itself.
func (s *snapshot[B]) lookup(name string) (string, *pool[B]) {
	if len(s.names) == 0 {
		return "", nil
	}
	name, ok := Normalise(name)
	if !ok {
		return "", nil
	}
	if p := s.names[name]; p != nil {
		return name, p
	}
	// Try "*.b.c" for "a.b.c", then "*.c". The key is built in one buffer so
	// the common miss allocates once.
	var arr [256]byte
	buf := arr[:0]
	for rest := name; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return "", nil
		}
		rest = rest[i+1:]
		buf = append(append(buf[:0], '*', '.'), rest...)
		if p := s.names[string(buf)]; p != nil { // map index by string(bytes) does not allocate
			return p.pattern, p
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
