package limits

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestPendingConnsMost: the source that has the most pending conns is
// found as conns come and go, of several that have as many the first to
// have had that many; a conn removed twice counts once; a source that
// has none left is forgotten.
func TestPendingConnsMost(t *testing.T) {
	a, b, c := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/32"), netip.MustParsePrefix("2001:db8::/64")
	var p Pending
	b1 := p.add(nil, b, true)
	a1 := p.add(nil, a, true)
	a2 := p.add(nil, a, true)
	if got := p.most(); got == nil || got.src != a || got.oldest() != a1 {
		t.Fatalf("most = %v, want a, whose oldest is its first", got)
	}
	b2 := p.add(nil, b, true)
	if got := p.most(); got.src != a {
		t.Fatalf("most = %v, want a, which had two first", got.src)
	}
	p.remove(a1)
	p.remove(a1)
	if p.total != 3 || p.most().src != b || p.most().oldest() != b1 {
		t.Fatalf("after a's first went (twice): total %d, most %v, want 3 and b, whose oldest is its first", p.total, p.most().src)
	}
	p.add(nil, c, true)
	for _, pc := range []*PendingConn{a2, b1, b2} {
		p.remove(pc)
	}
	if p.total != 1 || p.most().src != c || len(p.sources) != 1 {
		t.Fatalf("with c's one conn left: total %d, most %v, %d sources", p.total, p.most().src, len(p.sources))
	}
	var unranked Pending
	unranked.add(nil, a, false)
	if unranked.most() != nil || len(unranked.ranks) != 0 {
		t.Fatal("conns added unranked were ranked")
	}
}

// TestPendingConnsMostMatchesCount: over random adds and removes from a
// few sources, most always has as many conns as the source that has the
// most, counted anew, and every conn is counted once.
func TestPendingConnsMostMatchesCount(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var p Pending
	var live []*PendingConn
	for step := range 20_000 {
		if len(live) == 0 || rnd.IntN(3) > 0 {
			src := netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(rnd.IntN(8))}), 32)
			live = append(live, p.add(nil, src, true))
		} else {
			i := rnd.IntN(len(live))
			p.remove(live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		if len(live) > 200 { // shrink back now and then
			for _, pc := range live[100:] {
				p.remove(pc)
			}
			live = live[:100]
		}
		counts := map[netip.Prefix]int{}
		most := 0
		for _, pc := range live {
			counts[pc.from.src]++
			most = max(most, counts[pc.from.src])
		}
		got := 0
		if ps := p.most(); ps != nil {
			got = ps.conns.Len()
		}
		if got != most || p.total != len(live) || len(p.sources) != len(counts) {
			t.Fatalf("step %d: most has %d, total %d, %d sources; want %d, %d, %d", step, got, p.total, len(p.sources), most, len(live), len(counts))
		}
	}
}
