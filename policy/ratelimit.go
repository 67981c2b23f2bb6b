package policy

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"net/netip"
	"sync"
	"time"
)

// DefaultRateLimitClients is how many client addresses a rate limit
// remembers when Options.RateLimitClients is zero.
const DefaultRateLimitClients = 16384

// rateShards splits a table so that clients rarely wait on each other's
// lock.
const (
	rateShardBits = 4
	rateShards    = 1 << rateShardBits
)

// rateSweep bounds the slots looked at to make room for a new client.
const rateSweep = 8

// rateTable holds a token bucket per client source (an IPv4 address, an
// IPv6 /64) in a bounded table: however many sources appear, it holds at
// most its capacity, evicting with a clock sweep that prefers buckets that
// are full again (as good as forgotten) and otherwise sources not seen
// since the hand last passed. A source evicted comes back with a full
// bucket: under a flood of new sources the limit errs on the side of
// letting requests through, never on the side of memory. Memory is fixed
// once the table is full: about 56 bytes per source.
type rateTable struct {
	burst   float64 // tokens a bucket holds
	perNano float64 // tokens a bucket gains per nanosecond
	seed    maphash.Seed
	shards  [rateShards]rateShard
}

// rateShard is part of a table: slots, and an index of them by key, open
// addressing with linear probing, twice as many positions as slots. Keys
// are hashed with the table's random seed, so that clients cannot choose
// addresses that collide.
type rateShard struct {
	mu    sync.Mutex
	max   int
	slots []rateSlot
	index []int32 // slot number + 1; 0: empty
	hand  int
}

type rateKey struct{ hi, lo uint64 }

type rateSlot struct {
	key    rateKey
	hash   uint64
	tokens float64
	last   int64 // when tokens was right, in ns since the table's epoch
	seen   bool  // used since the clock hand last passed
}

func newRateTable(r *RateLimit, clients int) *rateTable {
	if clients <= 0 {
		clients = DefaultRateLimitClients
	}
	t := &rateTable{
		burst:   float64(r.Requests),
		perNano: r.perSecond() / 1e9,
		seed:    maphash.MakeSeed(),
	}
	per := max((clients+rateShards-1)/rateShards, 1)
	for i := range t.shards {
		t.shards[i].max = per
	}
	return t
}

// sourceKey is the bucket a client address spends from: the address for
// IPv4, its /64 for IPv6 (one host's share of a network). The invalid
// address has a bucket of its own.
func sourceKey(a netip.Addr) rateKey {
	a = normAddr(a)
	if a.Is4() {
		return rateKey{lo: 1<<32 | uint64(binary.BigEndian.Uint32(a.AsSlice()))}
	}
	if a.Is6() {
		b := a.As16()
		return rateKey{hi: binary.BigEndian.Uint64(b[:8]), lo: 1 << 33}
	}
	return rateKey{}
}

// allow spends a token of a's bucket at now (ns since the epoch). When the
// bucket is empty it returns false and how long until a token is there.
func (t *rateTable) allow(a netip.Addr, now int64) (bool, time.Duration) {
	return t.allowKey(sourceKey(a), now)
}

// allowKey is allow for the bucket of k.
func (t *rateTable) allowKey(k rateKey, now int64) (bool, time.Duration) {
	h := maphash.Comparable(t.seed, k)
	s := &t.shards[h>>(64-rateShardBits)]
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.find(k, h)
	if i < 0 {
		i = s.insert(k, h, t, now)
	}
	sl := &s.slots[i]
	sl.seen = true
	tokens := min(t.burst, sl.tokens+float64(now-sl.last)*t.perNano)
	sl.last = now
	if tokens >= 1 {
		sl.tokens = tokens - 1
		return true, 0
	}
	sl.tokens = tokens
	wait := math.Ceil((1 - tokens) / t.perNano)
	return false, time.Duration(wait)
}

// find returns the slot of k, or -1.
func (s *rateShard) find(k rateKey, h uint64) int {
	if len(s.index) == 0 {
		return -1
	}
	mask := uint64(len(s.index) - 1)
	for pos := h & mask; ; pos = (pos + 1) & mask {
		v := s.index[pos]
		if v == 0 {
			return -1
		}
		if sl := &s.slots[v-1]; sl.hash == h && sl.key == k {
			return int(v - 1)
		}
	}
}

// insert makes a slot for k, full, and returns its number.
func (s *rateShard) insert(k rateKey, h uint64, t *rateTable, now int64) int {
	if s.index == nil {
		n := 1
		for n < 2*s.max {
			n <<= 1
		}
		s.index = make([]int32, n)
	}
	fresh := rateSlot{key: k, hash: h, tokens: t.burst, last: now}
	var i int
	if len(s.slots) < s.max {
		s.slots = append(s.slots, fresh)
		i = len(s.slots) - 1
	} else {
		i = s.victim(t, now)
		s.unindex(i)
		s.slots[i] = fresh
	}
	mask := uint64(len(s.index) - 1)
	pos := h & mask
	for s.index[pos] != 0 {
		pos = (pos + 1) & mask
	}
	s.index[pos] = int32(i + 1)
	return i
}

// victim chooses the slot to give to a new source.
func (s *rateShard) victim(t *rateTable, now int64) int {
	v := -1
	for range rateSweep {
		sl := &s.slots[s.hand]
		full := sl.tokens+float64(now-sl.last)*t.perNano >= t.burst
		if full || !sl.seen {
			v = s.hand
			break
		}
		sl.seen = false
		s.hand = (s.hand + 1) % len(s.slots)
	}
	if v < 0 {
		v = s.hand // all seen lately: the hand's anyway
	}
	s.hand = (v + 1) % len(s.slots)
	return v
}

// unindex removes slot i from the index, moving back the entries after it
// that would no longer be found (deletion without tombstones).
func (s *rateShard) unindex(i int) {
	mask := uint64(len(s.index) - 1)
	pos := s.slots[i].hash & mask
	for s.index[pos] != int32(i+1) {
		pos = (pos + 1) & mask
	}
	s.index[pos] = 0
	for next := (pos + 1) & mask; s.index[next] != 0; next = (next + 1) & mask {
		home := s.slots[s.index[next]-1].hash & mask
		// Move the entry at next into the hole unless its home lies
		// cyclically in (pos, next].
		if (next-home)&mask >= (next-pos)&mask {
			s.index[pos], s.index[next] = s.index[next], 0
			pos = next
		}
	}
}

// len is the number of sources the table remembers.
func (t *rateTable) len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.slots)
		s.mu.Unlock()
	}
	return n
}
