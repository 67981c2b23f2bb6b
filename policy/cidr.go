package policy

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
)

// prefixSet answers whether an address is in any of a list of prefixes in
// O(log n) and without allocating: the prefixes become sorted, merged,
// disjoint ranges of addresses, searched by bisection.
type prefixSet struct {
	v4 []span[uint32]
	v6 []span[u128]
}

// span is a range of addresses, both ends included.
type span[T any] struct{ lo, hi T }

// u128 is an IPv6 address as two big-endian halves.
type u128 struct{ hi, lo uint64 }

func cmpU128(a, b u128) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

func (a u128) inc() (u128, bool) {
	lo := a.lo + 1
	hi := a.hi
	if lo == 0 {
		hi++
	}
	return u128{hi, lo}, a.hi == ^uint64(0) && a.lo == ^uint64(0)
}

// normPrefix masks p, and makes an IPv4-mapped IPv6 prefix (::ffff:0:0/96
// and longer) the IPv4 prefix it means: clients are matched by their
// unmapped address.
func normPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// normAddr is the form of a client address that prefixes are matched with.
func normAddr(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

func newPrefixSet(ps []netip.Prefix) *prefixSet {
	s := new(prefixSet)
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = normPrefix(p)
		a := p.Addr()
		if a.Is4() {
			lo := binary.BigEndian.Uint32(a.AsSlice())
			hi := lo | uint32(uint64(1)<<(32-p.Bits())-1)
			s.v4 = append(s.v4, span[uint32]{lo, hi})
			continue
		}
		b := a.As16()
		lo := u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
		hi := lo
		// Go's shifts by the width or more give 0, so /0 works too.
		if bits := p.Bits(); bits <= 64 {
			hi.hi |= uint64(1)<<(64-bits) - 1
			hi.lo = ^uint64(0)
		} else {
			hi.lo |= uint64(1)<<(128-bits) - 1
		}
		s.v6 = append(s.v6, span[u128]{lo, hi})
	}
	s.v4 = merge(s.v4, cmp.Compare[uint32], func(a uint32) (uint32, bool) { return a + 1, a == ^uint32(0) })
	s.v6 = merge(s.v6, cmpU128, u128.inc)
	return s
}

// merge sorts spans and joins those that overlap or touch.
func merge[T any](ss []span[T], cmp func(a, b T) int, next func(T) (T, bool)) []span[T] {
	slices.SortFunc(ss, func(a, b span[T]) int { return cmp(a.lo, b.lo) })
	out := ss[:0]
	for _, s := range ss {
		if n := len(out); n > 0 {
			last := &out[n-1]
			after, wrapped := next(last.hi)
			if wrapped || cmp(s.lo, after) <= 0 {
				if cmp(s.hi, last.hi) > 0 {
					last.hi = s.hi
				}
				continue
			}
		}
		out = append(out, s)
	}
	return slices.Clip(out)
}

// find returns the span holding lo..hi, if any.
func find[T any](ss []span[T], cmp func(a, b T) int, lo, hi T) bool {
	// The first span starting after lo; the one before it is the only
	// candidate.
	i, _ := slices.BinarySearchFunc(ss, lo, func(s span[T], t T) int {
		if cmp(s.lo, t) <= 0 {
			return -1
		}
		return 1
	})
	return i > 0 && cmp(ss[i-1].hi, hi) >= 0
}

// contains reports whether a is in the set. An invalid address is in no set.
func (s *prefixSet) contains(a netip.Addr) bool {
	a = normAddr(a)
	switch {
	case a.Is4():
		v := binary.BigEndian.Uint32(a.AsSlice())
		return find(s.v4, cmp.Compare[uint32], v, v)
	case a.Is6():
		b := a.As16()
		v := u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
		return find(s.v6, cmpU128, v, v)
	}
	return false
}

// covers reports whether every address of p is in the set.
func (s *prefixSet) covers(p netip.Prefix) bool {
	one := newPrefixSet([]netip.Prefix{p})
	switch {
	case len(one.v4) == 1:
		return find(s.v4, cmp.Compare[uint32], one.v4[0].lo, one.v4[0].hi)
	case len(one.v6) == 1:
		return find(s.v6, cmpU128, one.v6[0].lo, one.v6[0].hi)
	}
	return false
}

// len is the number of disjoint ranges the set holds.
func (s *prefixSet) len() int { return len(s.v4) + len(s.v6) }
