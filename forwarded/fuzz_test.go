package forwarded

import (
	"context"
	"crypto/tls"
	"maps"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
)

// The fuzz targets check the package against references written apart from
// it: regular expressions for the RFC 9110 and RFC 7239 grammars, httpguts
// for what net/http accepts, and net/http's own reading of Connection. All
// header values come from the network. The seed corpora run in every go test.

// The grammar of a Forwarded element (RFC 7239 section 4, RFC 9110 section
// 5.6), with the whitespace around ';' that validElement tolerates, matched
// against latin1 text so that obs-text bytes are characters.
const (
	refTokenExpr  = "[!#$%&'*+.^_`|~0-9A-Za-z-]+"
	refQuotedExpr = `"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"`
	refPairExpr   = "(" + refTokenExpr + ")=(?:(" + refTokenExpr + ")|(" + refQuotedExpr + "))"
)

var (
	refToken   = regexp.MustCompile(`\A` + refTokenExpr + `\z`)
	refQuoted  = regexp.MustCompile(`\A` + refQuotedExpr)
	refPair    = regexp.MustCompile(refPairExpr)
	refElement = regexp.MustCompile(`\A[\t ]*(?:` + refPairExpr + `)?[\t ]*(?:;[\t ]*(?:` + refPairExpr + `)?[\t ]*)*\z`)
	// RFC 3986 scheme.
	refScheme = regexp.MustCompile(`\A[A-Za-z][A-Za-z0-9+.-]*\z`)
)

// latin1 returns s with each byte as the rune of the same value.
func latin1(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteRune(rune(s[i]))
	}
	return b.String()
}

// unlatin1 undoes latin1.
func unlatin1(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		b = append(b, byte(r))
	}
	return string(b)
}

// refValidElement reports whether elem is a forwarded-element.
func refValidElement(elem string) bool {
	return elem != "" && refElement.MatchString(latin1(elem))
}

// refUnquote returns the value of a quoted-string or a token.
func refUnquote(v string) string {
	if !strings.HasPrefix(v, `"`) {
		return v
	}
	var b []byte
	for i := 1; i < len(v)-1; i++ {
		if v[i] == '\\' {
			i++
		}
		b = append(b, v[i])
	}
	return string(b)
}

// param is a parameter of a forwarded-element.
type param struct{ name, value string }

// refParams returns the parameters of a valid forwarded-element, in order,
// with their values unquoted.
func refParams(elem string) []param {
	var ps []param
	for _, m := range refPair.FindAllStringSubmatch(latin1(elem), -1) {
		v := m[2] + m[3]
		ps = append(ps, param{unlatin1(m[1]), refUnquote(unlatin1(v))})
	}
	return ps
}

// refCTL reports whether s holds a byte that no header value may hold: a
// control character other than HTAB.
func refCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return true
		}
	}
	return false
}

// refListElements returns the elements of lines that a list append keeps:
// split at every comma, trimmed of SP and HTAB, neither empty nor holding a
// control character.
func refListElements(lines []string) []string {
	var out []string
	for _, line := range lines {
		for _, e := range strings.Split(line, ",") {
			if e = strings.Trim(e, " \t"); e != "" && !refCTL(e) {
				out = append(out, e)
			}
		}
	}
	return out
}

// refForwardedPiece matches the start of a Forwarded line (as latin1 text)
// up to its first comma outside a quoted string, in which a backslash
// escapes the next byte; an unterminated quoted string runs to the end.
var refForwardedPiece = regexp.MustCompile(`\A(?s:[^",]|"(?:[^"\\]|\\.)*(?:"|\\?\z))*`)

// refForwardedElements splits lines at the commas outside quoted strings
// and returns the elements trimmed of SP and HTAB, empty ones left out, and
// the valid ones among them.
func refForwardedElements(lines []string) (all, valid []string) {
	for _, line := range lines {
		rest := latin1(line)
		for {
			piece := refForwardedPiece.FindString(rest)
			if e := strings.Trim(unlatin1(piece), " \t"); e != "" {
				all = append(all, e)
				if refValidElement(e) {
					valid = append(valid, e)
				}
			}
			if rest = rest[len(piece):]; rest == "" {
				break
			}
			rest = rest[len(","):]
		}
	}
	return all, valid
}

// The forwarding headers.
var refForwarding = []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded"}

// refConnectionNames returns the canonical names of the headers that h's
// Connection header lists, as httputil.ReverseProxy reads it.
func refConnectionNames(h http.Header) map[string]bool {
	names := map[string]bool{}
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				names[http.CanonicalHeaderKey(sf)] = true
			}
		}
	}
	return names
}

// refRemoveHopByHop removes the headers that h's Connection header lists,
// and Connection, as httputil.ReverseProxy does.
func refRemoveHopByHop(h http.Header) {
	for name := range refConnectionNames(h) {
		h.Del(name)
	}
	h.Del("Connection")
}

// refConnection returns the Connection header that Append leaves when the
// one in h lists forwarding headers: the other names, or nil.
func refConnection(h http.Header) []string {
	var kept []string
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" && !slices.Contains(refForwarding, http.CanonicalHeaderKey(sf)) {
				kept = append(kept, sf)
			}
		}
	}
	if kept == nil {
		return nil
	}
	return []string{strings.Join(kept, ", ")}
}

// refHop is a hop's values as this package must write them; "" is unknown.
type refHop struct {
	addr        netip.Addr // unmapped, without zone; invalid if unknown
	port        uint16
	proto, host string
}

func newRefHop(hop Hop) refHop {
	r := refHop{addr: hop.For.Addr().WithZone("").Unmap(), port: hop.For.Port()}
	if refScheme.MatchString(hop.Proto) {
		r.proto = strings.ToLower(hop.Proto)
	}
	if hop.Host != "" && httpguts.ValidHostHeader(hop.Host) && !strings.Contains(hop.Host, ",") {
		r.host = hop.Host
	}
	return r
}

// forValue returns the X-Forwarded-For value of r.
func (r refHop) forValue() string {
	if !r.addr.IsValid() {
		return ""
	}
	return r.addr.String()
}

// node returns the value of the for parameter of r, unquoted.
func (r refHop) node() string {
	if !r.addr.IsValid() {
		return "unknown"
	}
	n := r.addr.String()
	if r.addr.Is6() {
		n = "[" + n + "]"
	}
	if r.port != 0 {
		n += ":" + strconv.Itoa(int(r.port))
	}
	return n
}

// checkElement checks that elem is a valid forwarded-element for r alone:
// for, then proto and host if known.
func checkElement(t *testing.T, elem string, r refHop) {
	t.Helper()
	if !refValidElement(elem) {
		t.Fatalf("element %q is not valid", elem)
	}
	want := []param{{"for", r.node()}}
	if r.proto != "" {
		want = append(want, param{"proto", r.proto})
	}
	if r.host != "" {
		want = append(want, param{"host", r.host})
	}
	if got := refParams(elem); !slices.Equal(got, want) {
		t.Fatalf("element %q has parameters %q, want %q", elem, got, want)
	}
}

// checkWritten checks a header line that the package wrote: net/http sends
// it, and it is a list that neither starts nor ends with a separator.
func checkWritten(t *testing.T, key, v string) {
	t.Helper()
	if !httpguts.ValidHeaderFieldValue(v) || refCTL(v) {
		t.Fatalf("%s: %q is not a valid header value", key, v)
	}
	if v == "" || strings.Trim(v, " \t,") != v {
		t.Fatalf("%s: %q is empty or starts or ends with a separator", key, v)
	}
}

// hopCall is one call of Append or Rewrite, for checkHop.
type hopCall struct {
	opts   *Options
	hop    Hop
	src    http.Header // a copy of the header set with the prior values
	before http.Header // a copy of the header set written, before the call
	after  http.Header // the header set written, after the call
}

// checkHop checks the forwarding headers written by c against what the
// documentation of Options, Policy, Hop and Append says.
func checkHop(t *testing.T, c hopCall) {
	t.Helper()
	var opts Options
	if c.opts != nil {
		opts = *c.opts
	}
	r := newRefHop(c.hop)
	trusted := opts.TrustedPeers == nil
	for _, p := range opts.TrustedPeers {
		trusted = trusted || p.Contains(r.addr)
	}
	listed := refConnectionNames(c.src)
	priorLines := func(key string) []string {
		if !trusted || listed[key] {
			return nil
		}
		return c.src[key]
	}
	policy := func(p, def Policy) Policy {
		switch p {
		case PolicyDefault:
			return def
		case PolicyAppend, PolicyReplace, PolicyKeep:
			return p
		}
		return PolicyStrip
	}

	for _, l := range []struct {
		key, value string
		policy     Policy
	}{
		{"X-Forwarded-For", r.forValue(), opts.XForwardedFor},
		{"X-Forwarded-Proto", r.proto, opts.XForwardedProto},
		{"X-Forwarded-Host", r.host, opts.XForwardedHost},
	} {
		p := policy(l.policy, PolicyAppend)
		prior := refListElements(priorLines(l.key))
		got, ok := c.after[l.key]
		switch {
		case p == PolicyKeep && len(prior) > 0:
			if !ok || !slices.Equal(got, c.src[l.key]) {
				t.Fatalf("%s: kept %q, want %q as it came", l.key, got, c.src[l.key])
			}
			continue
		case l.value == "" || p == PolicyStrip:
			if ok {
				t.Fatalf("%s: %q, want none (policy %d, value %q)", l.key, got, p, l.value)
			}
			continue
		case p != PolicyAppend:
			prior = nil
		}
		if len(got) != 1 {
			t.Fatalf("%s: %d lines %q, want 1", l.key, len(got), got)
		}
		checkWritten(t, l.key, got[0])
		// Exactly one hop added, after the prior elements.
		elems := strings.Split(got[0], ", ")
		if !slices.Equal(elems, append(prior, l.value)) {
			t.Fatalf("%s: %q, want %q then %q", l.key, got[0], prior, l.value)
		}
	}

	got, ok := c.after["Forwarded"]
	_, prior := refForwardedElements(priorLines("Forwarded"))
	switch p := policy(opts.Forwarded, PolicyStrip); {
	case p == PolicyStrip:
		if ok {
			t.Fatalf("Forwarded: %q, want none", got)
		}
	case p == PolicyKeep && len(prior) > 0:
		if !ok || !slices.Equal(got, c.src["Forwarded"]) {
			t.Fatalf("Forwarded: kept %q, want %q as it came", got, c.src["Forwarded"])
		}
	default:
		if p != PolicyAppend {
			prior = nil
		}
		if len(got) != 1 {
			t.Fatalf("Forwarded: %d lines %q, want 1", len(got), got)
		}
		checkWritten(t, "Forwarded", got[0])
		all, valid := refForwardedElements(got)
		if !slices.Equal(all, valid) || len(all) != len(prior)+1 || !slices.Equal(all[:len(prior)], prior) {
			t.Fatalf("Forwarded: %q is not the valid prior elements %q and one more", got[0], prior)
		}
		if want := strings.Join(append(prior, all[len(prior)]), ", "); got[0] != want {
			t.Fatalf("Forwarded: %q, want %q", got[0], want)
		}
		checkElement(t, all[len(prior)], r)
	}

	// Connection lists no forwarding header that the package writes.
	listedBefore := refConnectionNames(c.before)
	wantConn, wantOK := c.before["Connection"]
	if slices.ContainsFunc(refForwarding, func(k string) bool { return listedBefore[k] }) {
		wantConn = refConnection(c.before)
		wantOK = wantConn != nil
	}
	if gotConn, ok := c.after["Connection"]; ok != wantOK || !slices.Equal(gotConn, wantConn) {
		t.Fatalf("Connection: %q, want %q (listing %v)", gotConn, wantConn, listedBefore)
	}
	removed := c.after.Clone()
	refRemoveHopByHop(removed)
	for _, k := range refForwarding {
		if _, ok := c.after[k]; ok && removed[k] == nil {
			t.Fatalf("%s is removed as hop-by-hop by Connection: %q", k, c.after["Connection"])
		}
	}

	// Other headers are left alone.
	for k, v := range c.before {
		if k != "Connection" && !slices.Contains(refForwarding, k) && !reflect.DeepEqual(c.after[k], v) {
			t.Fatalf("%s: %q, was %q", k, c.after[k], v)
		}
	}
	for k := range c.after {
		if _, ok := c.before[k]; !ok && !slices.Contains(refForwarding, k) {
			t.Fatalf("header %s added", k)
		}
	}
}

// fuzzLines returns the header lines that s encodes: lines separated by RS
// (0x1e) bytes. ok is false for "", no header; "\x1d" is a header with no
// lines.
func fuzzLines(s string) (lines []string, ok bool) {
	switch s {
	case "":
		return nil, false
	case "\x1d":
		return []string{}, true
	}
	return strings.Split(s, "\x1e"), true
}

// fuzzHeader returns a header set with the X-Forwarded-For,
// X-Forwarded-Proto, X-Forwarded-Host, Forwarded and Connection lines that
// the arguments encode (see fuzzLines), and two others.
func fuzzHeader(xff, xfp, xfh, fwd, conn string) http.Header {
	h := http.Header{"Accept": {"a", "b"}, "X-Real-Ip": {"198.51.100.1"}}
	for k, s := range map[string]string{
		"X-Forwarded-For":   xff,
		"X-Forwarded-Proto": xfp,
		"X-Forwarded-Host":  xfh,
		"Forwarded":         fwd,
		"Connection":        conn,
	} {
		if lines, ok := fuzzLines(s); ok {
			h[k] = lines
		}
	}
	return h
}

// fuzzAddrPort returns the address that s encodes: "ip:port", a bare IP,
// or 4 or 16 bytes with port 4711; anything else is unknown.
func fuzzAddrPort(s string) netip.AddrPort {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 0)
	}
	if a, ok := netip.AddrFromSlice([]byte(s)); ok {
		return netip.AddrPortFrom(a, 4711)
	}
	return netip.AddrPort{}
}

// Bits of the flags argument of the Append and Rewrite fuzz targets.
const (
	flagTrust   = 3      // TrustedPeers: nil, none, some, all
	flagTLS     = 1 << 2 // Rewrite: the request came over TLS
	flagHost    = 1 << 3 // Options.Host is set
	flagOutConn = 1 << 4 // Rewrite: pr.Out keeps In's Connection
	flagOutJunk = 1 << 5 // Rewrite: pr.Out has forwarding headers
	flagOutNil  = 1 << 6 // Rewrite: pr.Out.Header is nil
)

// fuzzOptions returns the options that policies (a nibble per header, in
// the order of the Options fields) and flags encode, or nil for the
// defaults.
func fuzzOptions(policies uint16, flags uint8) *Options {
	if policies == 0 && flags&(flagTrust|flagHost) == 0 {
		return nil
	}
	o := &Options{
		XForwardedFor:   Policy(policies & 0xf),
		XForwardedProto: Policy(policies >> 4 & 0xf),
		XForwardedHost:  Policy(policies >> 8 & 0xf),
		Forwarded:       Policy(policies >> 12),
	}
	switch flags & flagTrust {
	case 1:
		o.TrustedPeers = []netip.Prefix{}
	case 2:
		o.TrustedPeers = []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("2001:db8::/32"),
			netip.MustParsePrefix("fe80::/10"),
		}
	case 3:
		o.TrustedPeers = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	}
	if flags&flagHost != 0 {
		o.Host = "localhost:3000"
	}
	return o
}

// Policies for the seeds, a nibble per header.
var seedPolicies = []uint16{
	0x0000, // defaults
	0x1111, // append, Forwarded too
	0x2222, // replace
	0x3333, // keep
	0x4321, // one of each
	0x7777, // undefined, acting as strip
}

// hopSeed is a seed of the Append and Rewrite fuzz targets: the prior
// values (see fuzzLines), and the hop.
type hopSeed struct {
	xff, xfp, xfh, fwd, conn string
	for_, proto, host        string
}

// hopSeeds holds the inputs of the table tests and nastier ones.
var hopSeeds = []hopSeed{
	{for_: "192.0.2.60:4711", proto: "https", host: "example.com"},
	{xff: "198.51.100.10", xfp: "http", xfh: "cdn.example", for_: "192.0.2.60:4711", proto: "https", host: "example.com"},
	{xff: "198.51.100.10\x1e203.0.113.5, 10.0.0.1", xfp: "https\x1ehttp", xfh: "a.example\x1eb.example", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: "\x1e , 198.51.100.10 ,, \x1e,203.0.113.5,\t", xfp: "\x1e", xfh: " , ", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: "\x1d", xfp: "\x1d", xfh: "\x1d", fwd: "\x1d", conn: "\x1d", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: "not-an-ip, unknown\x1e_hidden, [2001:db8::1]:80, \"quoted\"", xfp: "gopher", xfh: "a b", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: "198.51.100.10, evil\r\nX-Injected: 1\x1e\x00", xfh: "a\x7f", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: "198.51.100.10", for_: "[2001:db8::1]:4711", proto: "https", host: "example.com"},
	{for_: "[fe80::1%eth0]:80", proto: "https", host: "example.com"},
	{for_: "fe80::1%25eth0", proto: "https", host: "example.com"},
	{for_: "[::ffff:192.0.2.60]:80", proto: "https", host: "example.com"},
	{xff: "198.51.100.10", xfp: "http", for_: "", proto: "https", host: "example.com"},
	{for_: "192.0.2.60", proto: "HTTPS", host: "example.com"},
	{xfp: "https", for_: "192.0.2.60", proto: "", host: "example.com"},
	{xfp: "https", for_: "192.0.2.60", proto: "http\r\nX-Injected: 1", host: "example.com"},
	{xfh: "evil.example", for_: "192.0.2.60", proto: "https", host: "example.com\r\nX-Injected: 1"},
	{for_: "192.0.2.60", proto: "https", host: "example.com,evil.example"},
	{xfh: "evil.example", for_: "192.0.2.60", proto: "https", host: ""},
	{xfh: "example.com:8080", for_: "192.0.2.60", proto: "https", host: "[2001:db8::1]:8443"},
	{fwd: "for=198.51.100.10", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{conn: "keep-alive, x-forwarded-for\x1eForwarded", xff: "198.51.100.10", xfp: "http", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{conn: "X-Forwarded-Proto, X-Forwarded-Host", xfp: "https", xfh: "evil.example", for_: "192.0.2.60", proto: "http", host: "example.com"},
	{conn: "X-Forwarded-For\r\n, close\r\x1ex-forwarded-ho\u017ft", xff: "198.51.100.10", xfh: "cdn.example", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{conn: " ,X-FORWARDED-FOR ,\tclose\t,, upgrade", xff: "198.51.100.10", for_: "10.1.2.3", proto: "http", host: "example.com"},
	{conn: "X-Forwarded-Hôst, Forwarded\x80, x-forwarded-proto\xff", xfh: "cdn.example", xfp: "http", fwd: "for=a", for_: "10.1.2.3", proto: "http", host: "example.com"},
	{xff: "198.51.100.10\x1e203.0.113.5", xfp: "http", xfh: "cdn.example", fwd: "for=198.51.100.10\x1efor=203.0.113.5;proto=http", for_: "192.0.2.60:4711", proto: "https", host: "example.com"},
	{xff: "", xfp: "", xfh: ",", fwd: `for="unterminated`, for_: "192.0.2.60:4711", proto: "https", host: "example.com"},
	{fwd: "for=198.51.100.10;proto=http\x1e for=\"[2001:db8::2]:80\" , for=unknown;by=_hidden", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{fwd: `for="a,b";host="x\"y\\"`, for_: "2001:db8::7", proto: "https", host: "example.com"},
	{fwd: `for=198.51.100.10; proto=http`, for_: "[2001:db8::1]:65535", proto: "wss", host: "[::1]:3000"},
	{fwd: "\x1e , ,for=198.51.100.10,", for_: "::ffff:10.1.2.3", proto: "coap+tcp", host: "a!b$c&d'e(f)g*h+i;j=k~l_m%20"},
	{fwd: "for=\"198.51.100.10\x1efor=198.51.100.11, for=\"x\\\"", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{fwd: "198.51.100.10\x1efor=\x1e=x\x1efor=a b\x1efor=[2001:db8::1]\x1efor=\"a\"b\x1efor=\"a\x01\"\x1efor=ok", for_: "192.0.2.60", proto: "https", host: "example.com"},
	{fwd: "for=\"\x80\xff\";by=\"\\\xff\", for=\"a\\", for_: "10.9.9.9", proto: "https", host: "example.com"},
	{fwd: `for=a\`, xff: `a\`, for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: "\x80\xff, é, \t\t", xfh: "\xc3\xa9.example", for_: "192.0.2.60", proto: "h\xc3\xa9", host: "\xc3\xa9.example"},
	{xff: strings.Repeat(",", 4096), fwd: strings.Repeat(`,"`, 2048), conn: strings.Repeat(", ", 1024), for_: "192.0.2.60", proto: "https", host: "example.com"},
	{xff: strings.Repeat("198.51.100.10,", 512), fwd: strings.Repeat("for=_hidden;by=unknown, ", 256), for_: "192.0.2.60", proto: "https", host: "example.com"},
	{for_: "\xc0\x00\x02\x3c", proto: "https", host: "example.com"},
	{for_: "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xc0\x00\x02\x3c", proto: "https", host: "example.com"},
	{for_: "0.0.0.0:0", proto: "http", host: "a"},
	{for_: "[::]:1", proto: "http", host: "\"quoted\""},
	{for_: "192.0.2.60:", proto: "http", host: `back\slash`},
}

// FuzzAppend checks Append and Options.Append with any prior values, hop
// and options: the X-Forwarded-* and Forwarded headers hold what the
// policies say (with append, the usable prior elements then exactly one
// hop), every value written is one line that net/http sends, with no
// control character, and that parses back to the hop, Connection lists no
// header written, other headers and the value slices of h are left alone.
func FuzzAppend(f *testing.F) {
	for _, s := range hopSeeds {
		for _, p := range seedPolicies {
			for _, flags := range []uint8{0, 1, 2} {
				f.Add(s.xff, s.xfp, s.xfh, s.fwd, s.conn, s.for_, s.proto, s.host, p, flags)
			}
		}
	}
	f.Fuzz(func(t *testing.T, xff, xfp, xfh, fwd, conn, for_, proto, host string, policies uint16, flags uint8) {
		in := fuzzHeader(xff, xfp, xfh, fwd, conn)
		orig := in.Clone()
		h := maps.Clone(in) // sharing the value slices
		hop := Hop{For: fuzzAddrPort(for_), Proto: proto, Host: host}
		opts := fuzzOptions(policies, flags)
		if opts == nil {
			Append(h, hop)
		} else {
			opts.Append(h, hop)
		}
		if !reflect.DeepEqual(in, orig) {
			t.Fatalf("Append changed the value slices of h:%v\nwere%v", in, orig)
		}
		checkHop(t, hopCall{opts: opts, hop: hop, src: orig, before: orig, after: h})
	})
}

// FuzzRewrite checks HopFromRequest and Rewrite, as httputil.ReverseProxy
// calls them, with any request: the hop is the request's, pr.In is left
// alone, pr.Out gets the forwarding headers that Append would write on
// pr.In's headers (checked as in FuzzAppend) and the Host the options say.
func FuzzRewrite(f *testing.F) {
	remotes := []string{"192.0.2.60:4711", "[2001:db8::1]:443", "[fe80::1%eth0]:80", "192.0.2.60", "", "@", "pipe", "[1.2.3.4]:80", "1.2.3.4:080", "::1:80"}
	for i, s := range hopSeeds {
		for j, p := range seedPolicies {
			flags := uint8(i*7+j*13) & (flagTrust | flagTLS | flagHost | flagOutConn | flagOutJunk | flagOutNil)
			f.Add(s.xff, s.xfp, s.xfh, s.fwd, s.conn, remotes[(i+j)%len(remotes)], s.host, p, flags)
		}
	}
	f.Fuzz(func(t *testing.T, xff, xfp, xfh, fwd, conn, remote, host string, policies uint16, flags uint8) {
		in := &http.Request{
			Method:     http.MethodGet,
			URL:        &url.URL{Path: "/"},
			Header:     fuzzHeader(xff, xfp, xfh, fwd, conn),
			Host:       host,
			RemoteAddr: remote,
		}
		if flags&flagTLS != 0 {
			in.TLS = &tls.ConnectionState{}
		}
		inHeader := in.Header.Clone()

		// What httputil.ReverseProxy does before Rewrite (and SetURL).
		out := in.Clone(context.Background())
		if flags&flagOutConn == 0 {
			refRemoveHopByHop(out.Header)
		}
		for _, k := range refForwarding {
			delete(out.Header, k)
		}
		if flags&flagOutJunk != 0 {
			out.Header["X-Forwarded-For"] = []string{"203.0.113.99"}
			out.Header["X-Forwarded-Proto"] = []string{"gopher"}
			out.Header["Forwarded"] = []string{"for=203.0.113.99"}
		}
		out.Host = ""
		before := out.Header.Clone()
		if flags&flagOutNil != 0 {
			out.Header, before = nil, http.Header{}
		}

		hop := HopFromRequest(in)
		wantFor := netip.AddrPort{}
		if ap, err := netip.ParseAddrPort(remote); err == nil {
			wantFor = ap
		} else if a, err := netip.ParseAddr(remote); err == nil {
			wantFor = netip.AddrPortFrom(a, 0)
		}
		wantProto := "http"
		if in.TLS != nil {
			wantProto = "https"
		}
		if hop != (Hop{For: wantFor, Proto: wantProto, Host: host}) {
			t.Fatalf("HopFromRequest: %+v, want for %v, proto %s, host %q", hop, wantFor, wantProto, host)
		}

		opts := fuzzOptions(policies, flags)
		pr := &httputil.ProxyRequest{In: in, Out: out}
		if opts == nil {
			Rewrite(pr, hop)
		} else {
			opts.Rewrite(pr, hop)
		}
		if !reflect.DeepEqual(in.Header, inHeader) || in.Host != host || in.RemoteAddr != remote {
			t.Fatalf("Rewrite changed pr.In")
		}
		wantHost := host
		if opts != nil && opts.Host != "" {
			wantHost = opts.Host
		}
		if out.Host != wantHost {
			t.Fatalf("pr.Out.Host %q, want %q", out.Host, wantHost)
		}
		checkHop(t, hopCall{opts: opts, hop: hop, src: inHeader, before: before, after: out.Header})

		// The forwarding headers are those Append writes on pr.In's.
		h := inHeader.Clone()
		opts.Append(h, hop)
		for _, k := range refForwarding {
			got, gotOK := out.Header[k]
			want, wantOK := h[k]
			if gotOK != wantOK || !slices.Equal(got, want) {
				t.Fatalf("%s: Rewrite wrote %q, Append %q", k, got, want)
			}
		}
	})
}

// FuzzList checks the list scanner of X-Forwarded-* and Connection values,
// and what is built on it: nextElement splits at every comma and trims SP
// and HTAB, joinList keeps the usable elements and adds exactly one,
// hasListElement agrees with it, and the forwarding headers that
// Connection lists are those net/http's hop-by-hop removal takes it to
// list.
func FuzzList(f *testing.F) {
	for _, s := range []string{
		"", ",", " ", "\t", " , ", ",,,", "\x1e", "\x1d",
		"198.51.100.10", "198.51.100.10, 203.0.113.5", "198.51.100.10\x1e203.0.113.5, 10.0.0.1",
		" , 198.51.100.10 ,, \x1e,203.0.113.5,\t",
		"not-an-ip, unknown\x1e_hidden, [2001:db8::1]:80, \"quoted\"",
		"198.51.100.10, evil\r\nX-Injected: 1\x1e\x00", "a\x7f", "a\tb", "\x80\xff, é",
		"2001:db8::1, fe80::1%eth0, [fe80::1%25eth0]:80, ::ffff:192.0.2.60",
		"keep-alive, x-forwarded-for\x1eForwarded", "X-Forwarded-Proto, X-Forwarded-Host",
		" ,X-FORWARDED-FOR ,\tclose\t,, upgrade", "X-Forwarded-Hôst, Forwarded\x80",
		"X-Forwarded-For\r\n", "\nx-forwarded-proto", "X-Forwarded-Ho\u017ft", "\u212a",
		"x-forwarded-for\x00", "X-Forwarded-For X", "X_Forwarded_For", "\"X-Forwarded-For\"",
		strings.Repeat(",", 4096), strings.Repeat("a,", 2048), strings.Repeat(" \t", 1024),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lines := strings.Split(s, "\x1e")
		var scanned []string
		for _, line := range lines {
			for rest := line; rest != ""; {
				var elem string
				before := rest
				elem, rest = nextElement(rest)
				if len(rest) >= len(before) {
					t.Fatalf("nextElement(%q) left %q", before, rest)
				}
				piece, _, _ := strings.Cut(before, ",")
				if elem != strings.Trim(piece, " \t") {
					t.Fatalf("nextElement(%q) = %q, want %q", before, elem, strings.Trim(piece, " \t"))
				}
				if usable(elem) {
					scanned = append(scanned, elem)
				}
			}
		}
		want := refListElements(lines)
		if !slices.Equal(scanned, want) {
			t.Fatalf("usable elements %q, want %q", scanned, want)
		}
		if hasListElement(lines) != (len(want) > 0) {
			t.Fatalf("hasListElement = %v with usable elements %q", hasListElement(lines), want)
		}
		for _, v := range []struct {
			s string
			b []byte
		}{{"https", nil}, {"", []byte("2001:db8::1")}} {
			got := joinList(lines, v.s, v.b)
			checkWritten(t, "list", got)
			if !slices.Equal(strings.Split(got, ", "), append(want, v.s+string(v.b))) {
				t.Fatalf("joinList = %q, want %q then %q", got, want, v.s+string(v.b))
			}
		}

		h := http.Header{"Connection": lines}
		names := refConnectionNames(h)
		wantBits := 0
		for i, k := range refForwarding {
			if names[k] {
				wantBits |= 1 << i
			}
		}
		if got := connectionListed(h); got != wantBits {
			t.Fatalf("connectionListed = %04b, want %04b (net/http reads %v)", got, wantBits, names)
		}
		removeFromConnection(h)
		if got, want := h["Connection"], refConnection(http.Header{"Connection": lines}); !slices.Equal(got, want) {
			t.Fatalf("removeFromConnection: %q, want %q", got, want)
		}
	})
}

// FuzzElements checks the scanner of Forwarded values: nextForwardedElement
// splits at the commas outside quoted strings, validElement accepts exactly
// the RFC 7239 forwarded-elements, endQuoted finds the end of an RFC 9110
// quoted-string, and joinForwarded keeps the valid elements and adds one,
// which no prior element can swallow.
func FuzzElements(f *testing.F) {
	for _, s := range []string{
		"", ",", ";", " ", `"`, `\`, `""`, `"\`, `\"`, "\x1e", "=", "for", "for=", "=a",
		"for=192.0.2.60", `for="[2001:db8::1]:4711";proto=https;host="a:1"`,
		`for="a\"b\\";by=_x`, "for=a;", ";for=a", "for=a ; proto=http", "for=a b",
		`for="a`, `for="a\"`, `for="a\`, `for="a"b`, `for=a"b"`, "for=\"a\x00\"",
		"for=\"a\r\nb\"", "fo r=a", "for=\"a\x7f\"", "for=\"a\\\x7f\"", "for=\"\x80\xff\\\xfe\"",
		"for=198.51.100.10;proto=http\x1e for=\"[2001:db8::2]:80\" , for=unknown;by=_hidden",
		`for="a,b";host="x\"y\\"`, `for=198.51.100.10; proto=http`, "\x1e , ,for=198.51.100.10,",
		"for=\"198.51.100.10\x1efor=198.51.100.11, for=\"x\\\"",
		"198.51.100.10\x1efor=\x1e=x\x1efor=a b\x1efor=[2001:db8::1]\x1efor=\"a\"b\x1efor=\"a\x01\"\x1efor=ok",
		`for="[2001:db8:cafe::17%25eth0]:4711"`, `for="_gazonk:_port"`, `for=unknown, for="[::1]"`,
		"for=a\t;\tproto=b\t", "FOR=A;Proto=HTTPS", `for=a,"b,c",d`, `a="\"",b="\\",c="\,"`,
		strings.Repeat(",", 4096), strings.Repeat(`"`, 4095), strings.Repeat(`\`, 4096),
		strings.Repeat(`for="a,\"",`, 512), strings.Repeat(";", 2048),
	} {
		f.Add(s)
	}
	const elem = `for="[2001:db8::1]:4711";proto=https;host="example.com:8443"`
	f.Fuzz(func(t *testing.T, s string) {
		lines := strings.Split(s, "\x1e")
		var scanned []string
		for _, line := range lines {
			for rest := line; rest != ""; {
				var e string
				before := rest
				e, rest = nextForwardedElement(rest)
				if len(rest) >= len(before) {
					t.Fatalf("nextForwardedElement(%q) left %q", before, rest)
				}
				if rest != "" && before[len(before)-len(rest)-1] != ',' {
					t.Fatalf("nextForwardedElement(%q) left %q, not after a comma", before, rest)
				}
				if e != "" {
					scanned = append(scanned, e)
				}
			}
			// As one element, untrimmed.
			if got, want := validElement(line), refValidElement(line); got != want {
				t.Fatalf("validElement(%q) = %v, want %v", line, got, want)
			}
		}
		all, valid := refForwardedElements(lines)
		if !slices.Equal(scanned, all) {
			t.Fatalf("elements %q, want %q", scanned, all)
		}
		var got []string
		for _, e := range all {
			if validElement(e) {
				got = append(got, e)
			}
		}
		if !slices.Equal(got, valid) {
			t.Fatalf("valid elements %q, want %q", got, valid)
		}
		if hasForwardedElement(lines) != (len(valid) > 0) {
			t.Fatalf("hasForwardedElement = %v with valid elements %q", hasForwardedElement(lines), valid)
		}

		joined := joinForwarded(lines, []byte(elem))
		checkWritten(t, "Forwarded", joined)
		if all2, valid2 := refForwardedElements([]string{joined}); !slices.Equal(all2, valid2) || !slices.Equal(all2, append(valid, elem)) {
			t.Fatalf("joinForwarded = %q, want %q then %q", joined, valid, elem)
		}

		text, at := latin1(s), 0 // s[i:] is text[at:]
		for i := 0; i < len(s); i++ {
			if i > 0 {
				at += utf8.RuneLen(rune(s[i-1]))
			}
			if s[i] != '"' {
				continue
			}
			m := refQuoted.FindString(text[at:])
			if j := endQuoted(s, i); j < 0 && m != "" || j >= 0 && unlatin1(m) != s[i:j] {
				t.Fatalf("endQuoted(%q, %d) = %d, want the end of %q", s, i, j, unlatin1(m))
			}
		}
	})
}

// FuzzQuoting checks the values the package writes: appendValue writes a
// token as is and anything else as a quoted-string that parses back to the
// value, cleanProto and validHost accept what RFC 3986 and net/http do, and
// appendElement writes a valid element that says what the hop says.
func FuzzQuoting(f *testing.F) {
	ip4 := []byte{192, 0, 2, 60}
	ip6 := netip.MustParseAddr("2001:db8::1").AsSlice()
	mapped := netip.MustParseAddr("::ffff:192.0.2.60").AsSlice()
	for _, s := range []string{
		"example.com", "https", "example.com:8080", "[2001:db8::1]", `a"b`, `a\b`, `"\`, "a b", "",
		"http", "HTTPS", "wss", "coap+tcp", "a1.-+", "1http", "ht tp", "http:", "http\r\n", "-http",
		"[::1]:3000", "a!b$c&d'e(f)g*h+i;j=k~l_m%20", "a,b", "a;b=c", "\t", "\x00", "\x7f", "\x80\xff",
		"é.example", "_hidden", "unknown", "[fe80::1%25eth0]:80", `\`, `"`, strings.Repeat("a", 300),
	} {
		for _, a := range [][]byte{nil, ip4, ip6, mapped} {
			f.Add(s, a, uint16(0))
			f.Add(s, a, uint16(4711))
		}
	}
	f.Fuzz(func(t *testing.T, s string, a []byte, port uint16) {
		v := string(appendValue([]byte("x="), s))
		if !strings.HasPrefix(v, "x=") {
			t.Fatalf("appendValue(%q) did not append: %q", s, v)
		}
		v = v[2:]
		token := refToken.MatchString(latin1(s))
		if isToken(s) != token {
			t.Fatalf("isToken(%q) = %v", s, !token)
		}
		switch {
		case token:
			if v != s {
				t.Fatalf("appendValue(%q) = %q, want it as is", s, v)
			}
		case refCTL(s):
			// Callers pass no control characters; what is written is not
			// valid, so it is dropped when it comes back.
			if validElement("x=" + v) {
				t.Fatalf("x=%s is valid", v)
			}
		default:
			if m := refQuoted.FindString(latin1(v)); unlatin1(m) != v || refUnquote(v) != s {
				t.Fatalf("appendValue(%q) = %s, not a quoted-string of it", s, v)
			}
			line := "x=" + v + ", y=z"
			if e, rest := nextForwardedElement(line); e != "x="+v || rest != " y=z" || !validElement(e) {
				t.Fatalf("nextForwardedElement(%q) = %q, %q", line, e, rest)
			}
		}

		wantProto := ""
		if refScheme.MatchString(s) {
			wantProto = strings.ToLower(s)
		}
		if got := cleanProto(s); got != wantProto || cleanProto(got) != got {
			t.Fatalf("cleanProto(%q) = %q, want %q", s, got, wantProto)
		}
		wantHost := s != "" && httpguts.ValidHostHeader(s) && !strings.Contains(s, ",")
		if validHost(s) != wantHost {
			t.Fatalf("validHost(%q) = %v, want %v", s, !wantHost, wantHost)
		}

		addr, _ := netip.AddrFromSlice(a)
		addr = addr.Unmap()
		hop := Hop{For: netip.AddrPortFrom(addr, port), Proto: s, Host: s}
		r := newRefHop(hop)
		elem := appendElement([]byte("x"), r.addr, r.port, r.proto, r.host)
		if elem[0] != 'x' {
			t.Fatalf("appendElement did not append: %q", elem)
		}
		checkElement(t, string(elem[1:]), r)
	})
}
