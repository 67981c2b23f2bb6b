package forwarded_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/forwarded"
)

// addr parses "ip:port", "[ipv6]:port" or a bare IP; "" is the zero value.
func addr(t testing.TB, s string) netip.AddrPort {
	t.Helper()
	if s == "" {
		return netip.AddrPort{}
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("bad address %q", s)
	}
	return netip.AddrPortFrom(a, 0)
}

// dump formats h one header line per value, sorted, for error messages.
func dump(h http.Header) string {
	var lines []string
	for k, vs := range h {
		for _, v := range vs {
			lines = append(lines, fmt.Sprintf("%s: %q", k, v))
		}
		if len(vs) == 0 {
			lines = append(lines, fmt.Sprintf("%s: (no values)", k))
		}
	}
	slices.Sort(lines)
	return "\n\t" + strings.Join(lines, "\n\t")
}

type appendCase struct {
	name string
	opts *forwarded.Options
	in   http.Header
	for_ string // Hop.For; "" is unknown
	// proto and host default to "https" and "example.com"; "-" means "".
	proto, host string
	want        http.Header
}

func (c appendCase) hop(t testing.TB) forwarded.Hop {
	hop := forwarded.Hop{For: addr(t, c.for_), Proto: c.proto, Host: c.host}
	switch hop.Proto {
	case "":
		hop.Proto = "https"
	case "-":
		hop.Proto = ""
	}
	switch hop.Host {
	case "":
		hop.Host = "example.com"
	case "-":
		hop.Host = ""
	}
	return hop
}

func runAppendCases(t *testing.T, cases []appendCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.in.Clone()
			if h == nil {
				h = http.Header{}
			}
			c.opts.Append(h, c.hop(t))
			want := c.want
			if want == nil {
				want = http.Header{}
			}
			if !reflect.DeepEqual(h, want) {
				t.Errorf("got%s\nwant%s", dump(h), dump(want))
			}
			// The package function is the nil *Options.
			if c.opts == nil {
				h := c.in.Clone()
				if h == nil {
					h = http.Header{}
				}
				forwarded.Append(h, c.hop(t))
				if !reflect.DeepEqual(h, want) {
					t.Errorf("forwarded.Append: got%s\nwant%s", dump(h), dump(want))
				}
			}
		})
	}
}

func TestAppend(t *testing.T) {
	runAppendCases(t, []appendCase{{
		name: "no prior value",
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "one prior value",
		in: http.Header{
			"X-Forwarded-For":   {"198.51.100.10"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"cdn.example"},
		},
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 192.0.2.60"},
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"cdn.example, example.com"},
		},
	}, {
		name: "several prior lines folded into one",
		in: http.Header{
			"X-Forwarded-For":   {"198.51.100.10", "203.0.113.5, 10.0.0.1"},
			"X-Forwarded-Proto": {"https", "http"},
			"X-Forwarded-Host":  {"a.example", "b.example"},
		},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.5, 10.0.0.1, 192.0.2.60"},
			"X-Forwarded-Proto": {"https, http, https"},
			"X-Forwarded-Host":  {"a.example, b.example, example.com"},
		},
	}, {
		name: "empty prior lines and elements skipped",
		in: http.Header{
			"X-Forwarded-For":   {"", " , 198.51.100.10 ,, ", ",203.0.113.5,\t"},
			"X-Forwarded-Proto": {""},
			"X-Forwarded-Host":  {" , "},
		},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.5, 192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "prior header with no values",
		in:   http.Header{"X-Forwarded-For": {}, "X-Forwarded-Proto": nil},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "garbage prior values kept verbatim",
		in: http.Header{
			"X-Forwarded-For":   {"not-an-ip, unknown", "_hidden, [2001:db8::1]:80, \"quoted\""},
			"X-Forwarded-Proto": {"gopher"},
			"X-Forwarded-Host":  {"a b"},
		},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Forwarded-For":   {"not-an-ip, unknown, _hidden, [2001:db8::1]:80, \"quoted\", 192.0.2.60"},
			"X-Forwarded-Proto": {"gopher, https"},
			"X-Forwarded-Host":  {"a b, example.com"},
		},
	}, {
		name: "prior elements with control characters dropped",
		in: http.Header{
			"X-Forwarded-For":  {"198.51.100.10, evil\r\nX-Injected: 1", "\x00"},
			"X-Forwarded-Host": {"a\x7f"},
		},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "IPv6 unbracketed and portless",
		in:   http.Header{"X-Forwarded-For": {"198.51.100.10"}},
		for_: "[2001:db8::1]:4711",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 2001:db8::1"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "zone dropped",
		for_: "[fe80::1%eth0]:80",
		want: http.Header{
			"X-Forwarded-For":   {"fe80::1"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "IPv4-mapped IPv6 unmapped",
		for_: "[::ffff:192.0.2.60]:80",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "unknown client: X-Forwarded-For removed, not left with the client's value last",
		in: http.Header{
			"X-Forwarded-For":   {"198.51.100.10"},
			"X-Forwarded-Proto": {"http"},
		},
		for_: "",
		want: http.Header{
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name:  "scheme in upper case written in lower case",
		for_:  "192.0.2.60",
		proto: "HTTPS",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name:  "empty scheme: X-Forwarded-Proto removed",
		in:    http.Header{"X-Forwarded-Proto": {"https"}},
		for_:  "192.0.2.60",
		proto: "-",
		want: http.Header{
			"X-Forwarded-For":  {"192.0.2.60"},
			"X-Forwarded-Host": {"example.com"},
		},
	}, {
		name:  "scheme with CR LF: X-Forwarded-Proto removed",
		in:    http.Header{"X-Forwarded-Proto": {"https"}},
		for_:  "192.0.2.60",
		proto: "http\r\nX-Injected: 1",
		want: http.Header{
			"X-Forwarded-For":  {"192.0.2.60"},
			"X-Forwarded-Host": {"example.com"},
		},
	}, {
		name: "host with CR LF: X-Forwarded-Host removed",
		in:   http.Header{"X-Forwarded-Host": {"evil.example"}},
		for_: "192.0.2.60",
		host: "example.com\r\nX-Injected: 1",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
		},
	}, {
		name: "host with a comma: X-Forwarded-Host removed",
		for_: "192.0.2.60",
		host: "example.com,evil.example",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
		},
	}, {
		name: "empty host: X-Forwarded-Host removed",
		in:   http.Header{"X-Forwarded-Host": {"evil.example"}},
		for_: "192.0.2.60",
		host: "-",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
		},
	}, {
		name: "host with port and IPv6 host",
		in:   http.Header{"X-Forwarded-Host": {"example.com:8080"}},
		for_: "192.0.2.60",
		host: "[2001:db8::1]:8443",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com:8080, [2001:db8::1]:8443"},
		},
	}, {
		name: "incoming Forwarded removed by default",
		in:   http.Header{"Forwarded": {"for=198.51.100.10"}},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "headers listed in Connection are absent, and unlisted",
		in: http.Header{
			"Connection":        {"keep-alive, x-forwarded-for", "Forwarded"},
			"X-Forwarded-For":   {"198.51.100.10"},
			"X-Forwarded-Proto": {"http"},
		},
		opts: &forwarded.Options{Forwarded: forwarded.PolicyAppend},
		for_: "192.0.2.60",
		want: http.Header{
			"Connection":        {"keep-alive"},
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {"for=192.0.2.60;proto=https;host=example.com"},
		},
	}, {
		name: "Connection listing only forwarding headers removed",
		in: http.Header{
			"Connection":        {"X-Forwarded-Proto, X-Forwarded-Host"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"evil.example"},
		},
		for_:  "192.0.2.60",
		proto: "http",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		// net/http trims CR and LF too when it removes hop-by-hop headers:
		// a name it finds must be found, or it would drop this hop.
		name: "Connection names trimmed as net/http trims them",
		in: http.Header{
			"Connection":      {"X-Forwarded-For\r\n, close\r"},
			"X-Forwarded-For": {"198.51.100.10"},
		},
		for_: "192.0.2.60",
		want: http.Header{
			"Connection":        {"close"},
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}, {
		name: "Connection names compared in ASCII case only",
		in: http.Header{
			"Connection":       {"X-Forwarded-Ho\u017ft"}, // long s, not a header net/http removes
			"X-Forwarded-Host": {"cdn.example"},
		},
		for_: "192.0.2.60",
		want: http.Header{
			"Connection":        {"X-Forwarded-Ho\u017ft"},
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"cdn.example, example.com"},
		},
	}, {
		name: "other headers untouched",
		in:   http.Header{"X-Real-Ip": {"198.51.100.10"}, "Accept": {"a", "b"}},
		for_: "192.0.2.60",
		want: http.Header{
			"X-Real-Ip":         {"198.51.100.10"},
			"Accept":            {"a", "b"},
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
		},
	}})
}

func TestPolicies(t *testing.T) {
	prior := http.Header{
		"X-Forwarded-For":   {"198.51.100.10", "203.0.113.5"},
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {"cdn.example"},
		"Forwarded":         {"for=198.51.100.10", "for=203.0.113.5;proto=http"},
	}
	all := func(p forwarded.Policy) *forwarded.Options {
		return &forwarded.Options{XForwardedFor: p, XForwardedProto: p, XForwardedHost: p, Forwarded: p}
	}
	const elem = `for="192.0.2.60:4711";proto=https;host=example.com`
	runAppendCases(t, []appendCase{{
		name: "append with prior values",
		opts: all(forwarded.PolicyAppend),
		in:   prior,
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.5, 192.0.2.60"},
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"cdn.example, example.com"},
			"Forwarded":         {"for=198.51.100.10, for=203.0.113.5;proto=http, " + elem},
		},
	}, {
		name: "append without prior values",
		opts: all(forwarded.PolicyAppend),
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {elem},
		},
	}, {
		name: "replace",
		opts: all(forwarded.PolicyReplace),
		in:   prior,
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {elem},
		},
	}, {
		name: "replace with unknown values removes",
		opts: all(forwarded.PolicyReplace),
		in:   prior,
		for_: "", proto: "-", host: "-",
		want: http.Header{"Forwarded": {"for=unknown"}},
	}, {
		name: "keep when present: left as it came",
		opts: all(forwarded.PolicyKeep),
		in:   prior,
		for_: "192.0.2.60:4711",
		want: prior,
	}, {
		name: "keep when absent: this hop's",
		opts: all(forwarded.PolicyKeep),
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {elem},
		},
	}, {
		name: "keep when only empty or invalid values: this hop's",
		opts: all(forwarded.PolicyKeep),
		in: http.Header{
			"X-Forwarded-For":   {"", " , "},
			"X-Forwarded-Proto": {""},
			"X-Forwarded-Host":  {","},
			"Forwarded":         {`for="unterminated`},
		},
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {elem},
		},
	}, {
		name: "keep with unknown values and nothing there: absent",
		opts: all(forwarded.PolicyKeep),
		for_: "", proto: "-", host: "-",
		want: http.Header{"Forwarded": {"for=unknown"}},
	}, {
		name: "strip",
		opts: all(forwarded.PolicyStrip),
		in:   prior,
		for_: "192.0.2.60:4711",
		want: http.Header{},
	}, {
		name: "strip without prior values",
		opts: all(forwarded.PolicyStrip),
		for_: "192.0.2.60:4711",
		want: http.Header{},
	}, {
		name: "undefined policy acts as strip",
		opts: all(forwarded.Policy(200)),
		in:   prior,
		for_: "192.0.2.60:4711",
		want: http.Header{},
	}, {
		name: "one policy per header",
		opts: &forwarded.Options{
			XForwardedFor:   forwarded.PolicyAppend,
			XForwardedProto: forwarded.PolicyReplace,
			XForwardedHost:  forwarded.PolicyKeep,
			Forwarded:       forwarded.PolicyStrip,
		},
		in:   prior,
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.5, 192.0.2.60"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"cdn.example"},
		},
	}, {
		name: "zero options are the defaults",
		opts: &forwarded.Options{},
		in:   prior,
		for_: "192.0.2.60:4711",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.5, 192.0.2.60"},
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"cdn.example, example.com"},
		},
	}})
}

func TestTrustedPeers(t *testing.T) {
	prior := http.Header{
		"X-Forwarded-For":   {"198.51.100.10"},
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {"cdn.example"},
		"Forwarded":         {"for=198.51.100.10"},
	}
	// kept is prior with the hop appended; forNode is the peer as
	// Forwarded writes it.
	kept := func(peer, forNode string) http.Header {
		return http.Header{
			"X-Forwarded-For":   {"198.51.100.10, " + peer},
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"cdn.example, example.com"},
			"Forwarded":         {"for=198.51.100.10, for=" + forNode + ";proto=https;host=example.com"},
		}
	}
	// stripped is the hop alone.
	stripped := func(peer, forNode string) http.Header {
		return http.Header{
			"X-Forwarded-For":   {peer},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {"for=" + forNode + ";proto=https;host=example.com"},
		}
	}
	trust := func(prefixes ...string) *forwarded.Options {
		o := &forwarded.Options{Forwarded: forwarded.PolicyAppend, TrustedPeers: []netip.Prefix{}}
		for _, p := range prefixes {
			o.TrustedPeers = append(o.TrustedPeers, netip.MustParsePrefix(p))
		}
		return o
	}
	keepAll := trust("10.0.0.0/8")
	keepAll.XForwardedFor = forwarded.PolicyKeep
	keepAll.XForwardedProto = forwarded.PolicyKeep
	keepAll.XForwardedHost = forwarded.PolicyKeep
	keepAll.Forwarded = forwarded.PolicyKeep

	runAppendCases(t, []appendCase{{
		name: "nil trusts every peer",
		opts: &forwarded.Options{Forwarded: forwarded.PolicyAppend},
		in:   prior,
		for_: "192.0.2.60",
		want: kept("192.0.2.60", "192.0.2.60"),
	}, {
		name: "empty trusts no peer",
		opts: trust(),
		in:   prior,
		for_: "10.1.2.3",
		want: stripped("10.1.2.3", "10.1.2.3"),
	}, {
		name: "trusted IPv4 peer",
		opts: trust("192.0.2.0/24", "10.0.0.0/8"),
		in:   prior,
		for_: "10.1.2.3",
		want: kept("10.1.2.3", "10.1.2.3"),
	}, {
		name: "untrusted IPv4 peer",
		opts: trust("10.0.0.0/8"),
		in:   prior,
		for_: "192.0.2.60",
		want: stripped("192.0.2.60", "192.0.2.60"),
	}, {
		name: "trusted IPv6 peer",
		opts: trust("2001:db8::/32"),
		in:   prior,
		for_: "2001:db8::7",
		want: kept("2001:db8::7", `"[2001:db8::7]"`),
	}, {
		name: "untrusted IPv6 peer",
		opts: trust("2001:db8::/32"),
		in:   prior,
		for_: "2001:db9::7",
		want: stripped("2001:db9::7", `"[2001:db9::7]"`),
	}, {
		name: "IPv4-mapped peer matched as IPv4",
		opts: trust("10.0.0.0/8"),
		in:   prior,
		for_: "::ffff:10.1.2.3",
		want: kept("10.1.2.3", "10.1.2.3"),
	}, {
		name: "zoned peer matched without its zone",
		opts: trust("fe80::/10"),
		in:   prior,
		for_: "fe80::1%eth0",
		want: kept("fe80::1", `"[fe80::1]"`),
	}, {
		name: "unknown peer is not trusted",
		opts: trust("0.0.0.0/0", "::/0"),
		in:   prior,
		for_: "",
		want: http.Header{
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"example.com"},
			"Forwarded":         {"for=unknown;proto=https;host=example.com"},
		},
	}, {
		name: "untrusted peer: keep policies find nothing to keep",
		opts: keepAll,
		in:   prior,
		for_: "192.0.2.60",
		want: stripped("192.0.2.60", "192.0.2.60"),
	}, {
		name: "trusted peer: keep policies keep",
		opts: keepAll,
		in:   prior,
		for_: "10.9.9.9",
		want: prior,
	}, {
		name: "untrusted peer: headers listed in Connection unlisted too",
		opts: trust(),
		in:   http.Header{"Connection": {"X-Forwarded-For"}, "X-Forwarded-For": {"198.51.100.10"}},
		for_: "192.0.2.60",
		want: stripped("192.0.2.60", "192.0.2.60"),
	}})
}

func TestForwarded(t *testing.T) {
	on := &forwarded.Options{Forwarded: forwarded.PolicyAppend}
	for _, c := range []struct {
		name              string
		for_, proto, host string
		prior             []string
		want              string
	}{
		{"IPv4", "192.0.2.60", "http", "example.com", nil,
			`for=192.0.2.60;proto=http;host=example.com`},
		{"IPv4 with port quoted", "192.0.2.60:4711", "http", "example.com", nil,
			`for="192.0.2.60:4711";proto=http;host=example.com`},
		{"IPv6 bracketed and quoted", "2001:db8::1", "https", "example.com", nil,
			`for="[2001:db8::1]";proto=https;host=example.com`},
		{"IPv6 with port", "[2001:db8::1]:4711", "https", "example.com", nil,
			`for="[2001:db8::1]:4711";proto=https;host=example.com`},
		{"IPv4-mapped unmapped", "[::ffff:192.0.2.60]:4711", "https", "example.com", nil,
			`for="192.0.2.60:4711";proto=https;host=example.com`},
		{"zone dropped", "[fe80::1%eth0]:4711", "https", "example.com", nil,
			`for="[fe80::1]:4711";proto=https;host=example.com`},
		{"unknown client", "", "https", "example.com", nil,
			`for=unknown;proto=https;host=example.com`},
		{"host with port quoted", "192.0.2.60", "https", "example.com:8443", nil,
			`for=192.0.2.60;proto=https;host="example.com:8443"`},
		{"IPv6 host quoted", "192.0.2.60", "https", "[2001:db8::1]:8443", nil,
			`for=192.0.2.60;proto=https;host="[2001:db8::1]:8443"`},
		{"host with sub-delims quoted", "192.0.2.60", "https", "a;b=c", nil,
			`for=192.0.2.60;proto=https;host="a;b=c"`},
		{"unknown scheme and host omitted", "192.0.2.60", "", "bad host", nil,
			`for=192.0.2.60`},
		{"scheme lower-cased", "192.0.2.60", "HTTP", "example.com", nil,
			`for=192.0.2.60;proto=http;host=example.com`},
		{"prior elements kept, lines folded", "192.0.2.60", "https", "example.com",
			[]string{`for=198.51.100.10;proto=http`, ` for="[2001:db8::2]:80" , for=unknown;by=_hidden`},
			`for=198.51.100.10;proto=http, for="[2001:db8::2]:80", for=unknown;by=_hidden, for=192.0.2.60;proto=https;host=example.com`},
		{"quoted commas and escapes kept in one element", "192.0.2.60", "https", "example.com",
			[]string{`for="a,b";host="x\"y\\"`},
			`for="a,b";host="x\"y\\", for=192.0.2.60;proto=https;host=example.com`},
		{"whitespace around semicolons tolerated", "192.0.2.60", "https", "example.com",
			[]string{`for=198.51.100.10; proto=http`},
			`for=198.51.100.10; proto=http, for=192.0.2.60;proto=https;host=example.com`},
		{"empty prior elements skipped", "192.0.2.60", "https", "example.com",
			[]string{"", " , ,for=198.51.100.10,"},
			`for=198.51.100.10, for=192.0.2.60;proto=https;host=example.com`},
		{"unterminated quote dropped, cannot swallow this hop", "192.0.2.60", "https", "example.com",
			[]string{`for="198.51.100.10`, `for=198.51.100.11, for="x\"`},
			`for=198.51.100.11, for=192.0.2.60;proto=https;host=example.com`},
		{"malformed elements dropped", "192.0.2.60", "https", "example.com",
			[]string{`198.51.100.10`, `for=`, `=x`, `for=a b`, `for=[2001:db8::1]`, `for="a"b`, "for=\"a\x01\"", `for=ok`},
			`for=ok, for=192.0.2.60;proto=https;host=example.com`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			if c.prior != nil {
				h["Forwarded"] = c.prior
			}
			on.Append(h, forwarded.Hop{For: addr(t, c.for_), Proto: c.proto, Host: c.host})
			if got := h["Forwarded"]; len(got) != 1 || got[0] != c.want {
				t.Errorf("Forwarded: %q\nwant        %q", got, c.want)
			}
		})
	}
}

// TestForwardedConsistent checks that the last Forwarded element says what
// the last X-Forwarded-* values say.
func TestForwardedConsistent(t *testing.T) {
	on := &forwarded.Options{Forwarded: forwarded.PolicyAppend}
	for _, a := range []string{"192.0.2.60", "192.0.2.60:1", "[2001:db8::1]:65535", "2001:db8::1", "::ffff:192.0.2.60", "fe80::1%eth0"} {
		for _, proto := range []string{"http", "https", "HTTPS", "wss"} {
			for _, host := range []string{"example.com", "example.com:8080", "[::1]:3000", "a!b$c&d'e(f)g*h+i;j=k~l_m%20"} {
				hop := forwarded.Hop{For: addr(t, a), Proto: proto, Host: host}
				h := http.Header{
					"X-Forwarded-For":   {"198.51.100.10"},
					"X-Forwarded-Proto": {"http"},
					"X-Forwarded-Host":  {"cdn.example"},
					"Forwarded":         {`for=198.51.100.10;proto=http;host=cdn.example`},
				}
				on.Append(h, hop)
				elems := parseForwarded(t, h.Get("Forwarded"))
				if len(elems) != 2 {
					t.Fatalf("%v: %d elements in %q", hop, len(elems), h.Get("Forwarded"))
				}
				last := elems[len(elems)-1]
				forNode := last["for"]
				if ap, err := netip.ParseAddrPort(forNode); err == nil {
					forNode = ap.Addr().String()
				} else {
					forNode = strings.Trim(forNode, "[]")
				}
				for _, kv := range [][2]string{
					{forNode, lastValue(h, "X-Forwarded-For")},
					{last["proto"], lastValue(h, "X-Forwarded-Proto")},
					{last["host"], lastValue(h, "X-Forwarded-Host")},
				} {
					if kv[0] != kv[1] {
						t.Errorf("%v: Forwarded says %q, X-Forwarded-* %q\n%s", hop, kv[0], kv[1], dump(h))
					}
				}
			}
		}
	}
}

// lastValue returns the last comma-separated value of h[key], which must
// be one line.
func lastValue(h http.Header, key string) string {
	vs := h[key]
	if len(vs) != 1 {
		return fmt.Sprintf("(%d lines)", len(vs))
	}
	return strings.TrimSpace(vs[0][strings.LastIndexByte(vs[0], ',')+1:])
}

// parseForwarded is a strict RFC 7239 parser, independent of the package's.
func parseForwarded(t *testing.T, s string) []map[string]string {
	t.Helper()
	var elems []map[string]string
	elem := map[string]string{}
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] != '=' {
			j++
		}
		if j == len(s) {
			t.Fatalf("no '=' after %q in %q", s[i:], s)
		}
		name := strings.ToLower(s[i:j])
		j++
		var val strings.Builder
		if j < len(s) && s[j] == '"' {
			for j++; ; j++ {
				if j >= len(s) {
					t.Fatalf("unterminated quoted string in %q", s)
				}
				if s[j] == '\\' {
					j++
				} else if s[j] == '"' {
					j++
					break
				}
				val.WriteByte(s[j])
			}
		} else {
			for j < len(s) && s[j] != ';' && s[j] != ',' {
				val.WriteByte(s[j])
				j++
			}
		}
		elem[name] = val.String()
		switch {
		case j == len(s):
			i = j
		case s[j] == ';':
			i = j + 1
		case strings.HasPrefix(s[j:], ", "):
			elems = append(elems, elem)
			elem = map[string]string{}
			i = j + 2
		default:
			t.Fatalf("unexpected %q in %q", s[j:], s)
		}
	}
	return append(elems, elem)
}

// TestAppendDoesNotModifyValueSlices checks that Append writes new slices:
// a header set may share them with another, as httputil's documentation
// suggests doing with an inbound request's.
func TestAppendDoesNotModifyValueSlices(t *testing.T) {
	in := http.Header{
		"X-Forwarded-For":   {"198.51.100.10"},
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {"cdn.example"},
		"Forwarded":         {"for=198.51.100.10"},
		"Connection":        {"keep-alive"},
	}
	want := in.Clone()
	out := http.Header{}
	for k, v := range in {
		out[k] = v
	}
	opts := &forwarded.Options{XForwardedProto: forwarded.PolicyReplace, Forwarded: forwarded.PolicyAppend}
	opts.Append(out, forwarded.Hop{For: addr(t, "192.0.2.60"), Proto: "https", Host: "example.com"})
	if !reflect.DeepEqual(in, want) {
		t.Errorf("shared header set changed:%s\nwant%s", dump(in), dump(want))
	}
}

func TestAppendAllocs(t *testing.T) {
	hop := forwarded.Hop{For: netip.MustParseAddrPort("192.0.2.60:4711"), Proto: "https", Host: "example.com"}
	for _, c := range []struct {
		name  string
		opts  *forwarded.Options
		prior bool
		want  float64
	}{
		// One string per new value that is not hop's own, plus one array
		// for all the new one-element slices.
		{"defaults, no prior values", nil, false, 2},
		{"defaults, prior values", nil, true, 4},
		{"with Forwarded, no prior values", &forwarded.Options{Forwarded: forwarded.PolicyAppend}, false, 3},
		{"with Forwarded, prior values", &forwarded.Options{Forwarded: forwarded.PolicyAppend}, true, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			got := testing.AllocsPerRun(100, func() {
				resetHeader(h, c.prior)
				c.opts.Append(h, hop)
			})
			if got > c.want {
				t.Errorf("%v allocations, want at most %v", got, c.want)
			}
		})
	}
}

// Prior values for benchmarks and allocation counts, in arrays so that
// resetting a header set allocates nothing.
var (
	priorFor       = [2]string{"198.51.100.10", "203.0.113.5"}
	priorProto     = [1]string{"http"}
	priorHost      = [1]string{"cdn.example"}
	priorForwarded = [1]string{"for=198.51.100.10;proto=http;host=cdn.example"}
)

// resetHeader empties h, then gives it prior values if prior is set.
func resetHeader(h http.Header, prior bool) {
	clear(h)
	if prior {
		h["X-Forwarded-For"] = priorFor[:]
		h["X-Forwarded-Proto"] = priorProto[:]
		h["X-Forwarded-Host"] = priorHost[:]
		h["Forwarded"] = priorForwarded[:]
	}
}

func BenchmarkAppend(b *testing.B) {
	hop := forwarded.Hop{For: netip.MustParseAddrPort("192.0.2.60:4711"), Proto: "https", Host: "example.com"}
	for _, c := range []struct {
		name  string
		opts  *forwarded.Options
		prior bool
	}{
		{"defaults/no-prior", nil, false},
		{"defaults/prior", nil, true},
		{"forwarded/no-prior", &forwarded.Options{Forwarded: forwarded.PolicyAppend}, false},
		{"forwarded/prior", &forwarded.Options{Forwarded: forwarded.PolicyAppend}, true},
		{"replace/prior", &forwarded.Options{XForwardedFor: forwarded.PolicyReplace, XForwardedProto: forwarded.PolicyReplace, XForwardedHost: forwarded.PolicyReplace}, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				resetHeader(h, c.prior)
				c.opts.Append(h, hop)
			}
		})
	}
}
