package policy

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

func TestPrefixSet(t *testing.T) {
	s := newPrefixSet(prefixes(
		"10.0.0.0/8", "10.1.0.0/16", // nested
		"192.168.1.7/24", // not masked
		"192.168.2.0/24", // touches the one before: merged
		"0.0.0.0/32", "255.255.255.255/32",
		"2001:db8::/32", "2001:db8:ffff::/48",
		"::ffff:172.16.0.0/108", // IPv4-mapped: 172.16.0.0/12
		"fe80::1/128",
		"ff00::/8",
	))
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.0.0.0", true}, {"10.255.255.255", true}, {"11.0.0.0", false}, {"9.255.255.255", false},
		{"192.168.1.0", true}, {"192.168.2.255", true}, {"192.168.3.0", false}, {"192.168.0.255", false},
		{"0.0.0.0", true}, {"0.0.0.1", false}, {"255.255.255.255", true}, {"255.255.255.254", false},
		{"::ffff:10.2.3.4", true}, // mapped client
		{"172.31.255.255", true}, {"172.32.0.0", false},
		{"2001:db8:1::1", true}, {"2001:db9::", false}, {"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"fe80::1", true}, {"fe80::1%eth0", true}, {"fe80::2", false},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true},
		{"::", false},
	} {
		if got := s.contains(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("contains(%s) = %v; want %v", tc.addr, got, tc.want)
		}
	}
	if s.contains(netip.Addr{}) {
		t.Error("the invalid address is in the set")
	}
	if n := s.len(); n != 8 {
		t.Errorf("%d ranges; want 8 (nested and touching prefixes merged)", n)
	}
	all := newPrefixSet(prefixes("0.0.0.0/0", "::/0"))
	for _, a := range []string{"0.0.0.0", "255.255.255.255", "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "1.2.3.4"} {
		if !all.contains(netip.MustParseAddr(a)) {
			t.Errorf("/0 does not contain %s", a)
		}
	}
}

// The set answers as a linear scan of the prefixes does, on random lists.
func TestPrefixSetMatchesScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randAddr := func(v6 bool) netip.Addr {
		if v6 {
			var b [16]byte
			binary.BigEndian.PutUint64(b[:8], 0x20010db8_00000000|rng.Uint64()&0xffff_ffff)
			binary.BigEndian.PutUint64(b[8:], rng.Uint64())
			return netip.AddrFrom16(b)
		}
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], 0x0a000000|rng.Uint32()&0xffffff)
		return netip.AddrFrom4(b)
	}
	for round := range 50 {
		var ps []netip.Prefix
		for range rng.IntN(200) {
			v6 := rng.IntN(2) == 0
			bits := 8 + rng.IntN(25)
			if v6 {
				bits = 32 + rng.IntN(97)
			}
			p, _ := randAddr(v6).Prefix(bits)
			ps = append(ps, p)
		}
		s := newPrefixSet(ps)
		for range 2000 {
			a := randAddr(rng.IntN(2) == 0)
			want := false
			for _, p := range ps {
				want = want || p.Contains(a)
			}
			if got := s.contains(a); got != want {
				t.Fatalf("round %d: contains(%s) = %v; a scan of %v says %v", round, a, got, ps, want)
			}
		}
	}
}

func TestAllowAddr(t *testing.T) {
	for _, tc := range []struct {
		allow, deny []netip.Prefix
		addr        string
		want        bool
	}{
		{nil, nil, "1.2.3.4", true},
		{prefixes("10.0.0.0/8"), nil, "10.1.2.3", true},
		{prefixes("10.0.0.0/8"), nil, "11.1.2.3", false},
		{prefixes("10.0.0.0/8"), prefixes("10.1.0.0/16"), "10.1.2.3", false}, // deny wins
		{prefixes("10.0.0.0/8"), prefixes("10.1.0.0/16"), "10.2.2.3", true},
		{prefixes("10.1.2.0/24"), prefixes("10.0.0.0/8"), "10.1.2.3", false}, // deny wins, even when wider
		{nil, prefixes("2001:db8::/32"), "2001:db8::1", false},
		{nil, prefixes("2001:db8::/32"), "2001:db9::1", true},
		{nil, prefixes("10.0.0.0/8"), "::ffff:10.0.0.1", false},
		{nil, prefixes("10.0.0.0/8"), "", false}, // unknown client, any list: refused
		{prefixes("10.0.0.0/8"), nil, "", false}, // likewise
		{nil, nil, "", true},                     // no list: nothing to refuse
	} {
		p := mustCompile(t, ProtoTCP, Spec{CIDRAllow: tc.allow, CIDRDeny: tc.deny}, Options{})
		if got := p.AllowAddr(mustAddr(tc.addr)); got != tc.want {
			t.Errorf("allow %v deny %v: AllowAddr(%q) = %v; want %v", tc.allow, tc.deny, tc.addr, got, tc.want)
		}
		ref, ok := p.AcceptConn(mustAddr(tc.addr))
		if ok != tc.want || !ok && ref.Code != CodePolicyDenied {
			t.Errorf("allow %v deny %v: AcceptConn(%q) = %v, %v; want %v", tc.allow, tc.deny, tc.addr, ref, ok, tc.want)
		}
	}
	var nilPolicy *Policy
	if !nilPolicy.AllowAddr(netip.Addr{}) {
		t.Error("a nil policy refuses")
	}
}

func mustCompile(t testing.TB, proto string, s Spec, opts Options) *Policy {
	t.Helper()
	p, err := Compile(t.Context(), proto, s, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAllowAddrAllocates(t *testing.T) {
	ps := make([]netip.Prefix, MaxCIDRs)
	for i := range ps {
		ps[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(i >> 8), byte(i), 0, 0}), 16)
	}
	p := mustCompile(t, ProtoTCP, Spec{CIDRDeny: ps}, Options{})
	a := netip.MustParseAddr("200.1.2.3")
	if n := testing.AllocsPerRun(100, func() { p.AllowAddr(a) }); n != 0 {
		t.Errorf("AllowAddr allocates %v times", n)
	}
}
