package policy

import (
	"net/http"
	"net/netip"
	"testing"
)

// BenchmarkCheck is one request through Check: with no policy (what every
// request pays: the reserved headers stripped), and with basic auth, a CIDR
// deny list of MaxCIDRs prefixes and an allow list, and request headers.
//
//	go test -run XXX -bench Check -benchmem ./policy/
func BenchmarkCheck(b *testing.B) {
	deny := make([]netip.Prefix, MaxCIDRs)
	for i := range deny {
		deny[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(i >> 8), byte(i), 0}), 24)
	}
	full := mustCompile(b, ProtoHTTPS, Spec{
		CIDRAllow:      prefixes("192.0.2.0/24", "2001:db8::/32"),
		CIDRDeny:       deny,
		BasicAuth:      &BasicAuth{Credentials: []string{"ann:correct-horse-battery-staple", "bob:x", "carol:y"}},
		RequestHeaders: &Headers{Add: []string{"X-Env: prod", "X-Team: infra"}, Remove: []string{"X-Debug"}},
	}, Options{})
	client := netip.MustParseAddr("192.0.2.1")
	auth := []string{basicHeader("ann", "correct-horse-battery-staple")}
	debug := []string{"1"}
	for _, bc := range []struct {
		name string
		p    *Policy
	}{
		{"none", nil},
		{"basic+cidr+headers", full},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r, _ := http.NewRequest("GET", "https://app.example.test/", nil)
			r.Header = http.Header{
				"Accept":     {"*/*"},
				"User-Agent": {"curl/8.5.0"},
			}
			w := discard{}
			b.ReportAllocs()
			for b.Loop() {
				// What Check removed, back as a new request has it.
				r.Header["Authorization"] = auth
				r.Header["X-Debug"] = debug
				if bc.p.Check(w, r, client) {
					b.Fatal("refused")
				}
			}
		})
	}
}

// BenchmarkAllowAddr is the L4 accept path's check against MaxCIDRs
// prefixes.
func BenchmarkAllowAddr(b *testing.B) {
	deny := make([]netip.Prefix, MaxCIDRs)
	for i := range deny {
		deny[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(i >> 8), byte(i), 0}), 24)
	}
	p := mustCompile(b, ProtoTCP, Spec{CIDRDeny: deny}, Options{})
	a := netip.MustParseAddr("100.20.30.40")
	b.ReportAllocs()
	for b.Loop() {
		p.AllowAddr(a)
	}
}

// BenchmarkRateLimit is AcceptConn with a rate limit, from many sources.
func BenchmarkRateLimit(b *testing.B) {
	p := mustCompile(b, ProtoTCP, Spec{RateLimit: &RateLimit{Requests: 1000}}, Options{})
	addrs := make([]netip.Addr, 1024)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p.AcceptConn(addrs[i%len(addrs)])
		i++
	}
}
