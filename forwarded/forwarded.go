package forwarded

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// The headers this package manages, in canonical form so that they index
// an http.Header directly.
const (
	headerFor        = "X-Forwarded-For"
	headerProto      = "X-Forwarded-Proto"
	headerHost       = "X-Forwarded-Host"
	headerForwarded  = "Forwarded"
	headerConnection = "Connection"
)

// Hop is one proxy hop: who asked, over which scheme, for which host.
type Hop struct {
	// For is the address of the client that sent the request to this proxy
	// (its immediate peer). It is written with IPv4-mapped IPv6 addresses
	// unmapped and zones dropped. A non-zero port is written only in
	// Forwarded (for="192.0.2.60:4711"); X-Forwarded-For never has a port.
	// The zero value means unknown: X-Forwarded-For is removed rather than
	// left ending in a value the client chose, and Forwarded says
	// for=unknown.
	For netip.AddrPort

	// Proto is the scheme the client used: "http" or "https" (any URI
	// scheme is accepted and written in lower case). Empty or malformed
	// means unknown: X-Forwarded-Proto is removed and Forwarded has no
	// proto parameter.
	Proto string

	// Host is the Host the client sent, such as "example.com" or
	// "example.com:8080". Empty, or with a byte that a Host header may not
	// hold or a comma, means unknown: X-Forwarded-Host is removed and
	// Forwarded has no host parameter.
	Host string
}

// Policy says what happens to a forwarding header that is already there
// when a hop is added. Values other than the constants below act as
// PolicyStrip.
type Policy uint8

const (
	// PolicyDefault is the zero Policy: PolicyAppend for the X-Forwarded-*
	// headers and PolicyStrip for Forwarded (see [Options]).
	PolicyDefault Policy = iota

	// PolicyAppend keeps the values already there, folded into one line
	// with empty elements skipped and others kept verbatim, and appends
	// this hop's: "198.51.100.10, 192.0.2.60". This is what ngrok does;
	// applications read the last value.
	PolicyAppend

	// PolicyReplace drops the values already there and writes this hop's
	// alone. Use it for applications that read the first value (Express
	// does, for X-Forwarded-Proto and X-Forwarded-Host).
	PolicyReplace

	// PolicyKeep leaves the header as it came when it has a non-empty
	// value, and writes this hop's otherwise. Use it with
	// [Options.TrustedPeers], so that only a known proxy's value is kept.
	PolicyKeep

	// PolicyStrip removes the header and writes nothing.
	PolicyStrip
)

// Options say how a hop is added. The zero value, like a nil *Options, is
// ngrok-compatible: X-Forwarded-* appended to, an incoming Forwarded
// removed, every peer trusted, Host preserved. Options may be used by many
// goroutines at once as long as none modifies them.
type Options struct {
	// XForwardedFor is the policy for X-Forwarded-For.
	// Zero means PolicyAppend.
	XForwardedFor Policy

	// XForwardedProto is the policy for X-Forwarded-Proto.
	// Zero means PolicyAppend.
	XForwardedProto Policy

	// XForwardedHost is the policy for X-Forwarded-Host.
	// Zero means PolicyAppend.
	XForwardedHost Policy

	// Forwarded is the policy for the RFC 7239 Forwarded header, whose
	// element for this hop carries the same address, scheme and host as
	// the X-Forwarded-* values (and the port of Hop.For, if not zero):
	// for="[2001:db8::1]:4711";proto=https;host=example.com.
	// Zero means PolicyStrip: no Forwarded header is written, and one that
	// came in is removed (as httputil.ReverseProxy does with Rewrite), since
	// without this hop it would end in an element the client chose.
	Forwarded Policy

	// TrustedPeers are the networks of the proxies whose forwarding
	// headers are believed. When Hop.For is in none of them (or unknown),
	// the X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host and
	// Forwarded headers that came in are removed before the hop is added,
	// whatever the policies. IPv4 peers are matched as IPv4, so write IPv4
	// prefixes in IPv4 form. Nil trusts every peer (ngrok-compatible); an
	// empty, non-nil slice trusts none.
	TrustedPeers []netip.Prefix

	// Host, if not empty, replaces the Host of the outbound request in
	// Rewrite, for upstreams that expect "localhost:3000";
	// X-Forwarded-Host still carries the Host the client sent. Empty
	// preserves the client's Host. Append, which sees only a header set,
	// does not use it.
	Host string
}

// Append adds hop to the forwarding headers in h with the default,
// ngrok-compatible options; see [Options.Append]. h must not be nil.
func Append(h http.Header, hop Hop) {
	(*Options)(nil).Append(h, hop)
}

// Append adds hop to the forwarding headers in h, each according to its
// policy, after removing those that came in from an untrusted peer. A nil
// *Options means the defaults. h must not be nil.
//
// Forwarding headers that h's Connection header lists are hop-by-hop: their
// values are treated as absent, and their names are removed from Connection
// so that a later removal of hop-by-hop headers does not drop the values
// Append writes.
//
// Append writes new value slices rather than modifying those in h, so h may
// share them with another header set (such as an inbound request's).
func (o *Options) Append(h http.Header, hop Hop) {
	o.apply(h, h, true, hop)
}

// Bits naming the forwarding headers in a set.
const (
	bitFor = 1 << iota
	bitProto
	bitHost
	bitForwarded
	bitAll = bitFor | bitProto | bitHost | bitForwarded
)

// apply writes to dst the forwarding headers for hop, built from the prior
// values in src. inPlace says that dst and src are the same header set.
func (o *Options) apply(dst, src http.Header, inPlace bool, hop Hop) {
	var opt Options
	if o != nil {
		opt = *o
	}
	// Prior values listed in Connection, or sent by an untrusted peer,
	// are treated as absent.
	hopByHop := connectionListed(src)
	absent := hopByHop
	if !opt.trusts(hop.For.Addr()) {
		absent = bitAll
	}

	addr := hop.For.Addr().WithZone("").Unmap()
	proto := cleanProto(hop.Proto)
	host := hop.Host
	if !validHost(host) {
		host = ""
	}

	w := writer{dst: dst, src: src, inPlace: inPlace}
	var buf [64]byte
	var addrText []byte // X-Forwarded-For's new value; nil if unknown
	if addr.IsValid() {
		addrText = addr.AppendTo(buf[:0])
	}
	w.list(headerFor, opt.XForwardedFor.or(PolicyAppend), absent&bitFor != 0, "", addrText)
	w.list(headerProto, opt.XForwardedProto.or(PolicyAppend), absent&bitProto != 0, proto, nil)
	w.list(headerHost, opt.XForwardedHost.or(PolicyAppend), absent&bitHost != 0, host, nil)
	if p := opt.Forwarded.or(PolicyStrip); p == PolicyStrip {
		delete(dst, headerForwarded)
	} else {
		var ebuf [128]byte
		elem := appendElement(ebuf[:0], addr, hop.For.Port(), proto, host)
		w.forwarded(p, absent&bitForwarded != 0, elem)
	}
	w.flush()

	if !inPlace {
		hopByHop = connectionListed(dst)
	}
	if hopByHop != 0 {
		removeFromConnection(dst)
	}
}

// or returns p, or def if p is PolicyDefault.
func (p Policy) or(def Policy) Policy {
	if p == PolicyDefault {
		return def
	}
	return p
}

// trusts reports whether the forwarding headers sent by peer are believed.
func (o *Options) trusts(peer netip.Addr) bool {
	if o.TrustedPeers == nil {
		return true
	}
	peer = peer.WithZone("").Unmap()
	for _, p := range o.TrustedPeers {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// writer collects the headers apply writes, so that the new one-element
// value slices share one allocation.
type writer struct {
	dst, src http.Header
	inPlace  bool // dst is src
	n        int
	keys     [4]string
	vals     [4]string
}

// prior returns src's values for key, or nil if they are treated as absent.
func (w *writer) prior(key string, absent bool) []string {
	if absent {
		return nil
	}
	return w.src[key]
}

// set records that dst[key] becomes the single value v.
func (w *writer) set(key, v string) {
	w.keys[w.n], w.vals[w.n] = key, v
	w.n++
}

// keep makes dst[key] the prior values, as they came.
func (w *writer) keep(key string, prior []string) {
	if !w.inPlace {
		w.dst[key] = slices.Clone(prior)
	}
}

// flush writes the values recorded by set.
func (w *writer) flush() {
	if w.n == 0 {
		return
	}
	vals := make([]string, w.n)
	for i := range w.n {
		vals[i] = w.vals[i]
		w.dst[w.keys[i]] = vals[i : i+1 : i+1]
	}
}

// list applies policy p to the X-Forwarded-* header key, whose new value
// is s, or b if s is empty; both empty means unknown.
func (w *writer) list(key string, p Policy, absent bool, s string, b []byte) {
	known := s != "" || len(b) > 0
	prior := w.prior(key, absent)
	switch p {
	case PolicyAppend:
		if known {
			w.set(key, joinList(prior, s, b))
			return
		}
	case PolicyKeep:
		if hasListElement(prior) {
			w.keep(key, prior)
			return
		}
		fallthrough
	case PolicyReplace:
		if known {
			if b != nil {
				s = string(b)
			}
			w.set(key, s)
			return
		}
	}
	delete(w.dst, key)
}

// forwarded applies policy p to the Forwarded header, whose new element is
// elem.
func (w *writer) forwarded(p Policy, absent bool, elem []byte) {
	prior := w.prior(headerForwarded, absent)
	switch p {
	case PolicyAppend:
		w.set(headerForwarded, joinForwarded(prior, elem))
	case PolicyKeep:
		if hasForwardedElement(prior) {
			w.keep(headerForwarded, prior)
			return
		}
		fallthrough
	case PolicyReplace:
		w.set(headerForwarded, string(elem))
	default:
		delete(w.dst, headerForwarded)
	}
}

// connectionListed returns the bits of the forwarding headers that h's
// Connection header lists.
func connectionListed(h http.Header) int {
	bits := 0
	for _, line := range h[headerConnection] {
		for s := line; s != ""; {
			var tok string
			tok, s = nextName(s)
			bits |= headerBit(tok)
		}
	}
	return bits
}

// headerBit returns the bit of the forwarding header named name, in any
// ASCII case, or 0. Header names are ASCII, and net/http compares them so:
// under Unicode case folding "X-Forwarded-Hoſt" (with U+017F, a long s)
// would name X-Forwarded-Host.
func headerBit(name string) int {
	switch {
	case equalFoldASCII(name, headerFor):
		return bitFor
	case equalFoldASCII(name, headerProto):
		return bitProto
	case equalFoldASCII(name, headerHost):
		return bitHost
	case equalFoldASCII(name, headerForwarded):
		return bitForwarded
	}
	return 0
}

// equalFoldASCII reports whether s and t are equal with ASCII letters
// compared without regard to case.
func equalFoldASCII(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lowerASCII(s[i]) != lowerASCII(t[i]) {
			return false
		}
	}
	return true
}

// lowerASCII returns c in lower case if it is an ASCII letter.
func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// removeFromConnection removes the names of the forwarding headers from h's
// Connection header, and the header itself if nothing is left.
func removeFromConnection(h http.Header) {
	var kept []string
	for _, line := range h[headerConnection] {
		for s := line; s != ""; {
			var tok string
			tok, s = nextName(s)
			if tok != "" && headerBit(tok) == 0 {
				kept = append(kept, tok)
			}
		}
	}
	if len(kept) == 0 {
		delete(h, headerConnection)
		return
	}
	h[headerConnection] = []string{strings.Join(kept, ", ")}
}
