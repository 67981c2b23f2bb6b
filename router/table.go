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

	mu sync.Mutex // serialises writers, and Names against them

	// Readers load from these maps without a lock; only writers, holding
	// mu, store to them.
	exact syncMap[string, *pool[B]] // key: normalised host name
	wild  syncMap[string, *pool[B]] // key: "example.test" for "*.example.test"
	// members holds one health record per distinct backend, shared by every
	// pool that contains it, so a backend that fails is skipped under every
	// name.
	members syncMap[B, *member[B]]
}

// pool is the backends of one name. It is never modified once stored in
// the table: a writer stores a new pool in its place.
type pool[B comparable] struct {
	pattern string // the normalised name or wildcard it is the pool of
	members []*member[B]
	next    atomic.Uint64 // round-robin cursor
}

func (p *pool[B]) has(b B) bool {
	return p != nil && slices.ContainsFunc(p.members, func(m *member[B]) bool { return m.b == b })
}

type member[B comparable] struct {
	b         B
	downUntil atomic.Int64 // unix nanoseconds; zero or past means healthy

	// patterns are the patterns whose pools hold b (most often one).
	// Only writers use it, holding Table.mu.
	patterns smallmap.Map[string, struct{}]
}

// Add adds backend b to the pool of name, a host name or a wildcard such as
// "*.example.test". Adding a backend already in the pool does nothing.
func (t *Table[B]) Add(name string, b B) error {
	pattern, err := normaliseKey(name)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	names, key := t.namesOf(pattern)
	old, _ := names.load(key)
	if old.has(b) {
		return nil
	}
	m, _ := t.members.load(b)
	if m == nil {
		m = &member[B]{b: b}
		t.members.store(b, m)
	}
	m.patterns.Set(pattern, struct{}{})
	p := &pool[B]{pattern: pattern}
	if old != nil {
		p.members = append(slices.Clip(old.members), m)
		p.next.Store(old.next.Load())
	} else {
		p.members = []*member[B]{m}
	}
	names.store(key, p)
	return nil
}

// Remove removes backend b from the pool of name and reports whether it was
// there. A name whose pool becomes empty is removed.
func (t *Table[B]) Remove(name string, b B) bool {
	pattern, err := normaliseKey(name)
	if err != nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pool(pattern); !p.has(b) {
		return false
	}
	t.removeFrom(pattern, b)
	m, _ := t.members.load(b)
	m.patterns.Delete(pattern)
	if m.patterns.Len() == 0 {
		t.members.delete(b) // no pool holds b: forget its health
	}
	return true
}

// RemoveBackend removes b from every name and returns how many names it was
// removed from. A tunnel edge calls it when an agent's session ends.
func (t *Table[B]) RemoveBackend(b B) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, _ := t.members.load(b)
	if m == nil {
		return 0
	}
	for pattern := range m.patterns.All() {
		t.removeFrom(pattern, b)
	}
	t.members.delete(b)
	return m.patterns.Len()
}

// removeFrom replaces the pool of pattern, which holds b, with one without
// b, or removes pattern when that leaves it empty. t.mu must be held.
func (t *Table[B]) removeFrom(pattern string, b B) {
	names, key := t.namesOf(pattern)
	old, _ := names.load(key)
	rest := slices.DeleteFunc(slices.Clone(old.members), func(m *member[B]) bool { return m.b == b })
	if len(rest) == 0 {
		names.delete(key)
		return
	}
	p := &pool[B]{pattern: pattern, members: rest}
	p.next.Store(old.next.Load())
	names.store(key, p)
}

// Match returns the pattern that name is routed by: name itself normalised,
// or the wildcard that covers it. ok is false when no route matches.
func (t *Table[B]) Match(name string) (pattern string, ok bool) {
	p := t.lookup(name)
	if p == nil {
		return "", false
	}
	return p.pattern, true
}

// Has reports whether any route matches name.
func (t *Table[B]) Has(name string) bool {
	return t.lookup(name) != nil
}

// Backends returns the backends routed to name, in the order to try them:
// starting at the pool's round-robin cursor (which each call advances), the
// healthy backends first, then those in cooldown as a last resort. The
// sequence is empty when no route matches. Report a backend that could not be
// reached with Fail, then take the next one from the sequence.
func (t *Table[B]) Backends(name string) iter.Seq[B] {
	p := t.lookup(name)
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
	p := t.lookup(name)
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
	if m, ok := t.members.load(b); ok {
		m.downUntil.Store(t.clock().Add(cd).UnixNano())
	}
}

// Succeed reports that b was reached, ending any cooldown early.
func (t *Table[B]) Succeed(b B) {
	if m, ok := t.members.load(b); ok && m.downUntil.Load() != 0 {
		m.downUntil.Store(0)
	}
}

// Names returns the routed names and wildcards, sorted.
func (t *Table[B]) Names() []string {
	var names []string
	t.mu.Lock() // a consistent view: no write half done
	for _, p := range t.exact.all() {
		names = append(names, p.pattern)
	}
	for _, p := range t.wild.all() {
		names = append(names, p.pattern)
	}
	t.mu.Unlock()
	slices.Sort(names)
	return names
}

// Pool returns the backends of the pattern name (an exact name or a
// wildcard, not resolved through wildcards), in pool order.
func (t *Table[B]) Pool(name string) []B {
	pattern, err := normaliseKey(name)
	if err != nil {
		return nil
	}
	p := t.pool(pattern)
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

// namesOf returns the map that holds the pool of a normalised pattern and
// its key there.
func (t *Table[B]) namesOf(pattern string) (*syncMap[string, *pool[B]], string) {
	if host, ok := strings.CutPrefix(pattern, "*."); ok {
		return &t.wild, host
	}
	return &t.exact, pattern
}

// pool returns the pool of a normalised pattern, or nil.
func (t *Table[B]) pool(pattern string) *pool[B] {
	names, key := t.namesOf(pattern)
	p, _ := names.load(key)
	return p
}

// lookup finds the pool for name: the exact name, else the longest wildcard
// covering it. A wildcard "*.example.test" covers one or more labels in
// front of "example.test", never "example.test" itself.
func (t *Table[B]) lookup(name string) *pool[B] {
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
