package policy

import (
	"errors"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

func TestCombineCIDR(t *testing.T) {
	op := Operator{Policy: Spec{
		CIDRAllow: prefixes("10.0.0.0/8", "192.168.0.0/16"),
		CIDRDeny:  prefixes("10.66.0.0/16"),
	}}
	agent := Spec{
		CIDRAllow: prefixes("10.1.0.0/16", "172.16.0.0/12", "192.168.5.0/24", "0.0.0.0/1"),
		CIDRDeny:  prefixes("10.1.1.0/24", "10.66.0.0/16"),
	}
	got, err := Combine(ProtoTCP, op, agent)
	if err != nil {
		t.Fatal(err)
	}
	if want := prefixes("10.66.0.0/16", "10.1.1.0/24"); !reflect.DeepEqual(got.CIDRDeny, want) {
		t.Errorf("deny = %v; want the union %v", got.CIDRDeny, want)
	}
	p := mustCompile(t, ProtoTCP, got, Options{})
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.1.2.3", true},     // in both allow lists
		{"10.2.0.1", true},     // operator 10/8, agent 0/1
		{"10.1.1.1", false},    // agent denies
		{"10.66.1.1", false},   // both deny
		{"172.16.0.1", false},  // agent allows, operator does not
		{"192.168.5.5", true},  // operator 192.168/16, agent 192.168.5/24
		{"192.168.6.1", false}, // operator allows; the agent's 0/1 does not cover 192/8
		{"8.8.8.8", false},
	} {
		if p.AllowAddr(netip.MustParseAddr(tc.addr)) != tc.want {
			t.Errorf("combined AllowAddr(%s) = %v; want %v", tc.addr, !tc.want, tc.want)
		}
	}
	// Disjoint allow lists: nobody is allowed.
	got, err = Combine(ProtoTCP, Operator{Policy: Spec{CIDRAllow: prefixes("10.0.0.0/8")}}, Spec{CIDRAllow: prefixes("192.168.0.0/16", "2001:db8::/32")})
	if err != nil {
		t.Fatal(err)
	}
	p = mustCompile(t, ProtoTCP, got, Options{})
	for _, a := range []string{"10.0.0.1", "192.168.0.1", "2001:db8::1", "8.8.8.8"} {
		if p.AllowAddr(netip.MustParseAddr(a)) {
			t.Errorf("disjoint allow lists let %s in", a)
		}
	}
}

func TestCombineKinds(t *testing.T) {
	basic := &BasicAuth{Credentials: []string{"a:b"}}
	hook := &Webhook{Provider: WebhookGitHub, Secret: "s"}
	for _, tc := range []struct {
		name  string
		proto string
		op    Operator
		agent Spec
		want  error
		check func(t *testing.T, s Spec)
	}{
		{name: "zero", proto: ProtoHTTP, check: func(t *testing.T, s Spec) {
			if !s.IsZero() {
				t.Errorf("got %v", s)
			}
		}},
		{name: "lower rate wins", proto: ProtoHTTP,
			op:    Operator{Policy: Spec{RateLimit: &RateLimit{Requests: 600, Seconds: 60}}}, // 10/s
			agent: Spec{RateLimit: &RateLimit{Requests: 20}},
			check: func(t *testing.T, s Spec) {
				if *s.RateLimit != (RateLimit{Requests: 600, Seconds: 60}) {
					t.Errorf("rate %+v", *s.RateLimit)
				}
			}},
		{name: "agent rate lower", proto: ProtoTCP,
			op:    Operator{Policy: Spec{RateLimit: &RateLimit{Requests: 100}}},
			agent: Spec{RateLimit: &RateLimit{Requests: 1, Seconds: 2}},
			check: func(t *testing.T, s Spec) {
				if *s.RateLimit != (RateLimit{Requests: 1, Seconds: 2}) {
					t.Errorf("rate %+v", *s.RateLimit)
				}
			}},
		{name: "operator kinds left out on tcp", proto: ProtoTCP,
			op:    Operator{Policy: Spec{BasicAuth: basic, CIDRDeny: prefixes("10.0.0.0/8"), ResponseHeaders: &Headers{Remove: []string{"Server"}}}},
			agent: Spec{},
			check: func(t *testing.T, s Spec) {
				if got := s.Kinds(); !slices.Equal(got, []string{KindCIDRDeny}) {
					t.Errorf("kinds %v", got)
				}
			}},
		{name: "basic from operator", proto: ProtoHTTP, op: Operator{Policy: Spec{BasicAuth: basic}},
			check: func(t *testing.T, s Spec) {
				if s.BasicAuth == basic || !reflect.DeepEqual(s.BasicAuth, basic) {
					t.Errorf("basic %+v (must be a copy)", s.BasicAuth)
				}
			}},
		{name: "basic twice", proto: ProtoHTTP, op: Operator{Policy: Spec{BasicAuth: basic}}, agent: Spec{BasicAuth: basic}, want: ErrConflict},
		{name: "webhook twice", proto: ProtoHTTP, op: Operator{Policy: Spec{Webhook: hook}}, agent: Spec{Webhook: hook}, want: ErrConflict},
		{name: "mtls twice", proto: ProtoHTTPS, op: Operator{Policy: Spec{MutualTLS: &MutualTLS{CAs: testCAPEM}}}, agent: Spec{MutualTLS: &MutualTLS{CAs: testCAPEM}}, want: ErrConflict},
		{name: "operator basic, agent oidc", proto: ProtoHTTPS, op: Operator{Policy: Spec{BasicAuth: basic}},
			agent: Spec{OIDC: &OIDC{Issuer: "https://id.example", ClientID: "c", AllowDomains: []string{"example.com"}}}, want: ErrProtocol},
		{name: "kind forbidden", proto: ProtoHTTP, op: Operator{Kinds: []string{KindCIDRDeny, KindRateLimit}}, agent: Spec{BasicAuth: basic}, want: ErrForbidden},
		{name: "kind allowed", proto: ProtoHTTP, op: Operator{Kinds: []string{KindBasicAuth}}, agent: Spec{BasicAuth: basic}},
		{name: "issuer forbidden", proto: ProtoHTTPS, op: Operator{OIDCIssuers: []string{"https://accounts.google.com"}},
			agent: Spec{OIDC: &OIDC{Issuer: "https://evil.example", ClientID: "c", AllowDomains: []string{"example.com"}}}, want: ErrForbidden},
		{name: "agent invalid", proto: ProtoTCP, agent: Spec{BasicAuth: basic}, want: ErrProtocol},
		{name: "operator invalid", proto: ProtoHTTP, op: Operator{Policy: Spec{RateLimit: &RateLimit{}}}, want: ErrInvalid},
		{name: "too many together", proto: ProtoTCP,
			op:    Operator{Policy: Spec{CIDRDeny: manyPrefixes(MaxCIDRs, 10)}},
			agent: Spec{CIDRDeny: manyPrefixes(1, 11)}, want: ErrTooLarge},
		{name: "headers", proto: ProtoHTTP,
			op: Operator{Policy: Spec{RequestHeaders: &Headers{
				Add:    []string{"X-Edge: 1", "X-Both: operator"},
				Remove: []string{"x-secret"},
			}}},
			agent: Spec{RequestHeaders: &Headers{
				Add:    []string{"X-App: 1", "X-Secret: from agent", "X-Both: agent", "X-Both: agent2"},
				Remove: []string{"X-Debug", "X-Secret"},
			}},
			check: func(t *testing.T, s Spec) {
				h := s.RequestHeaders
				if !slices.Equal(h.Remove, []string{"X-Debug", "X-Secret"}) {
					t.Errorf("remove %q", h.Remove)
				}
				if !slices.Equal(h.Add, []string{"X-App: 1", "X-Edge: 1", "X-Both: operator"}) {
					t.Errorf("add %q", h.Add)
				}
				p := mustCompile(t, ProtoHTTP, s, Options{})
				r := newRequest("GET", "/")
				r.Header.Set("X-Secret", "client")
				r.Header.Set("X-Both", "client")
				p.Check(discard{}, r, netip.MustParseAddr("1.2.3.4"))
				if got := r.Header["X-Both"]; !slices.Equal(got, []string{"operator"}) {
					t.Errorf("X-Both: %q", got)
				}
				if _, ok := r.Header["X-Secret"]; ok {
					t.Errorf("X-Secret kept")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Combine(tc.proto, tc.op, tc.agent)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Combine = %v; want %v", err, tc.want)
			}
			if err == nil && tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

// Combine shares no memory with its inputs: changing the result leaves the
// operator's policy as it was.
func TestCombineCopies(t *testing.T) {
	op := Operator{Policy: Spec{
		CIDRAllow: prefixes("10.0.0.0/8"),
		BasicAuth: &BasicAuth{Credentials: []string{"a:b"}},
		RateLimit: &RateLimit{Requests: 5},
	}}
	got, err := Combine(ProtoHTTP, op, Spec{})
	if err != nil {
		t.Fatal(err)
	}
	got.CIDRAllow[0] = netip.MustParsePrefix("0.0.0.0/0")
	got.BasicAuth.Credentials[0] = "x:y"
	got.RateLimit.Requests = 1
	if op.Policy.CIDRAllow[0].String() != "10.0.0.0/8" || op.Policy.BasicAuth.Credentials[0] != "a:b" || op.Policy.RateLimit.Requests != 5 {
		t.Errorf("the operator's policy changed: %+v", op.Policy)
	}
}

func manyPrefixes(n int, first byte) []netip.Prefix {
	ps := make([]netip.Prefix, n)
	for i := range ps {
		ps[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{first, byte(i >> 8), byte(i), 0}), 24)
	}
	return ps
}

func newRequest(method, target string) *http.Request {
	r, err := http.NewRequest(method, "http://app.example.test"+target, nil)
	if err != nil {
		panic(err)
	}
	r.RemoteAddr = "192.0.2.1:1234"
	r.Header = http.Header{}
	return r
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}
