package policy

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"
)

// However many addresses appear, a rate limit remembers at most its bound,
// and its memory stops growing: 200,000 addresses through a table of
// 4,096, where 6 bytes kept for each address that passed would show.
func TestRateTableBounded(t *testing.T) {
	const n = 200_000
	const clients = 4096
	p := mustCompile(t, ProtoTCP, Spec{RateLimit: &RateLimit{Requests: 10}}, Options{RateLimitClients: clients})
	tab := findAct[*rateAct](t, p).table
	addr := func(i int) netip.Addr {
		if i%2 == 0 {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], uint32(i))
			return netip.AddrFrom4(b)
		}
		var b [16]byte // a /64 of its own each
		binary.BigEndian.PutUint64(b[:8], 0x2001_0db8_0000_0000|uint64(i))
		return netip.AddrFrom16(b)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var warm uint64
	for i := range n {
		p.AcceptConn(addr(i))
		if i == 4*clients {
			warm = heap()
		}
		if i%(n/8) == 0 {
			if got := tab.len(); got > clients+rateShards {
				t.Fatalf("after %d addresses the table holds %d (bound %d)", i, got, clients)
			}
		}
	}
	after := heap()
	if got := tab.len(); got > clients+rateShards || got < clients/2 {
		t.Errorf("after %d addresses the table holds %d (bound %d)", n, got, clients)
	}
	// Once full, the table is reused: nothing grows with the addresses
	// seen. (Allow 1 MiB for the test's own noise.)
	if after > warm+1<<20 {
		t.Errorf("heap grew from %d to %d bytes over %d new addresses", warm, after, n-4*clients)
	}
	t.Logf("%d addresses: table %d, heap %d KiB once warm, %d KiB at the end", n, tab.len(), warm>>10, after>>10)
}

// A client that spends its tokens stays limited while fewer new sources
// than the table holds come and go.
func TestRateTableKeepsActive(t *testing.T) {
	clk := newClock()
	p := mustCompile(t, ProtoTCP, Spec{RateLimit: &RateLimit{Requests: 2, Seconds: 3600}}, Options{Now: clk.Now, RateLimitClients: 1024})
	active := netip.MustParseAddr("203.0.113.9")
	p.AcceptConn(active)
	p.AcceptConn(active)
	for i := range 500 {
		p.AcceptConn(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))
		if i%50 == 0 {
			if _, ok := p.AcceptConn(active); ok {
				t.Fatalf("after %d new sources the active client has tokens again", i)
			}
		}
	}
}

func TestSourceKey(t *testing.T) {
	same := [][2]string{
		{"2001:db8::1", "2001:db8::ffff:1"},
		{"192.0.2.1", "::ffff:192.0.2.1"},
		{"fe80::1%eth0", "fe80::2"},
	}
	for _, s := range same {
		if sourceKey(netip.MustParseAddr(s[0])) != sourceKey(netip.MustParseAddr(s[1])) {
			t.Errorf("%s and %s are different sources", s[0], s[1])
		}
	}
	differ := [][2]string{
		{"2001:db8:0:1::1", "2001:db8:0:2::1"},
		{"192.0.2.1", "192.0.2.2"},
		{"0.0.0.0", "::"},
		{"::", ""},
		{"0.0.0.0", ""},
	}
	for _, s := range differ {
		if sourceKey(mustAddr(s[0])) == sourceKey(mustAddr(s[1])) {
			t.Errorf("%q and %q are one source", s[0], s[1])
		}
	}
}

// Under churn, every remembered source is found through the index, which
// holds nothing else.
func TestRateTableIndex(t *testing.T) {
	p := mustCompile(t, ProtoTCP, Spec{RateLimit: &RateLimit{Requests: 1}}, Options{RateLimitClients: 64})
	tab := findAct[*rateAct](t, p).table
	for i := range 5000 {
		p.AcceptConn(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		if i%97 != 0 {
			continue
		}
		for si := range tab.shards {
			s := &tab.shards[si]
			used := 0
			for _, v := range s.index {
				if v != 0 {
					used++
				}
			}
			if used != len(s.slots) {
				t.Fatalf("after %d: shard %d indexes %d of %d slots", i, si, used, len(s.slots))
			}
			for j, sl := range s.slots {
				if got := s.find(sl.key, sl.hash); got != j {
					t.Fatalf("after %d: shard %d slot %d found at %d", i, si, j, got)
				}
			}
		}
	}
}
