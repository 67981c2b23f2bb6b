package forwarded

import (
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
)

// This file holds the header syntax: comma-separated lists, the values of
// a hop, and RFC 7239 elements with their quoting.

// nextElement returns the first comma-separated element of s, trimmed of
// optional whitespace (possibly empty), and the rest of s after the comma.
func nextElement(s string) (elem, rest string) {
	if i := strings.IndexByte(s, ','); i >= 0 {
		elem, rest = s[:i], s[i+1:]
	} else {
		elem = s
	}
	return trimOWS(elem), rest
}

// nextName returns the first comma-separated header name of a Connection
// line s, trimmed as net/http trims it when it removes hop-by-hop headers
// (of spaces, tabs, CRs and LFs), and the rest of s after the comma. A
// name that net/http would find must be found here, or a later removal of
// hop-by-hop headers could drop the values this package writes.
func nextName(s string) (name, rest string) {
	name, rest, _ = strings.Cut(s, ",")
	return textproto.TrimString(name), rest
}

// trimOWS trims the spaces and tabs around s.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// usable reports whether a list element is kept: not empty, and without
// control characters (which no header value may hold; tabs are allowed).
func usable(elem string) bool {
	if elem == "" {
		return false
	}
	for i := 0; i < len(elem); i++ {
		if c := elem[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// hasListElement reports whether lines hold a usable element.
func hasListElement(lines []string) bool { return hasElement(lines, nextElement, usable) }

// hasElement reports whether lines, split into elements by next, hold one
// that ok accepts.
func hasElement(lines []string, next func(string) (elem, rest string), ok func(string) bool) bool {
	for _, line := range lines {
		for s := line; s != ""; {
			var elem string
			elem, s = next(s)
			if ok(elem) {
				return true
			}
		}
	}
	return false
}

// joinList returns the usable elements of lines, verbatim, followed by the
// new value (s, or b if s is empty), separated by ", ".
func joinList(lines []string, s string, b []byte) string {
	n := 0
	for _, line := range lines {
		for rest := line; rest != ""; {
			var elem string
			elem, rest = nextElement(rest)
			if usable(elem) {
				n += len(elem) + len(", ")
			}
		}
	}
	if n == 0 {
		if s == "" {
			return string(b)
		}
		return s
	}
	var sb strings.Builder
	sb.Grow(n + len(s) + len(b))
	for _, line := range lines {
		for rest := line; rest != ""; {
			var elem string
			elem, rest = nextElement(rest)
			if usable(elem) {
				sb.WriteString(elem)
				sb.WriteString(", ")
			}
		}
	}
	sb.WriteString(s)
	sb.Write(b)
	return sb.String()
}

// cleanProto returns proto in lower case if it is a URI scheme
// (RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )), and "" otherwise.
func cleanProto(proto string) string {
	if proto == "" {
		return ""
	}
	upper := false
	for i := 0; i < len(proto); i++ {
		c := proto[i]
		switch {
		case 'a' <= c && c <= 'z':
		case 'A' <= c && c <= 'Z':
			upper = true
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return ""
		}
	}
	if upper {
		return strings.ToLower(proto)
	}
	return proto
}

// validHost reports whether host can be written as a forwarded host: not
// empty, and only bytes that net/http accepts in a Host header, less the
// comma that would split it in X-Forwarded-Host.
func validHost(host string) bool {
	if host == "" {
		return false
	}
	for i := 0; i < len(host); i++ {
		if !hostBytes[host[i]] {
			return false
		}
	}
	return true
}

// appendElement appends the RFC 7239 forwarded-element for a hop to b:
// for=192.0.2.60, for="192.0.2.60:4711", for="[2001:db8::1]",
// for="[2001:db8::1]:4711" or for=unknown, then proto and host if known.
// addr has no zone and is unmapped.
func appendElement(b []byte, addr netip.Addr, port uint16, proto, host string) []byte {
	b = append(b, "for="...)
	switch {
	case !addr.IsValid():
		b = append(b, "unknown"...)
	case addr.Is4() && port == 0:
		b = addr.AppendTo(b)
	default:
		b = append(b, '"')
		if addr.Is6() {
			b = append(b, '[')
			b = addr.AppendTo(b)
			b = append(b, ']')
		} else {
			b = addr.AppendTo(b)
		}
		if port != 0 {
			b = append(b, ':')
			b = strconv.AppendUint(b, uint64(port), 10)
		}
		b = append(b, '"')
	}
	if proto != "" {
		b = append(b, ";proto="...)
		b = appendValue(b, proto)
	}
	if host != "" {
		b = append(b, ";host="...)
		b = appendValue(b, host)
	}
	return b
}

// appendValue appends s to b as an RFC 7239 value: a token as is,
// anything else as a quoted string.
func appendValue(b []byte, s string) []byte {
	if isToken(s) {
		return append(b, s...)
	}
	return appendQuoted(b, s)
}

// appendQuoted appends s to b as an RFC 9110 quoted-string, escaping '"'
// and '\'.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool { return tokenBytes[c] }

// Byte sets: those of RFC 9110 tokens, and those validHost accepts.
var (
	tokenBytes = byteSet("!#$%&'*+-.^_`|~")
	hostBytes  = byteSet("!$%&'()*+-.:;=[]_~")
)

// byteSet returns the set of ASCII letters, digits and the bytes of extra.
func byteSet(extra string) (set [256]bool) {
	for c := '0'; c <= '9'; c++ {
		set[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		set[c], set[c-'a'+'A'] = true, true
	}
	for i := 0; i < len(extra); i++ {
		set[extra[i]] = true
	}
	return set
}

// nextForwardedElement returns the first element of a Forwarded header
// line s, trimmed of optional whitespace (possibly empty), and the rest of
// s after its comma. Commas inside quoted strings do not end an element;
// an unterminated quoted string runs to the end of s.
func nextForwardedElement(s string) (elem, rest string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			return trimOWS(s[:i]), s[i+1:]
		}
	}
	return trimOWS(s), ""
}

// validElement reports whether elem is a non-empty RFC 7239
// forwarded-element: pairs token=value, value a token or a quoted string,
// separated by ';' (with optional whitespace around it, which some proxies
// write). Only valid elements are passed on: an unbalanced quote in a prior
// element could swallow the one this package appends.
func validElement(elem string) bool {
	if elem == "" {
		return false
	}
	i := 0
	for {
		i = skipOWS(elem, i)
		if i < len(elem) && elem[i] != ';' {
			// token "=" ( token / quoted-string )
			j := i
			for j < len(elem) && isTchar(elem[j]) {
				j++
			}
			if j == i || j == len(elem) || elem[j] != '=' {
				return false
			}
			j++
			if j < len(elem) && elem[j] == '"' {
				if j = endQuoted(elem, j); j < 0 {
					return false
				}
			} else {
				k := j
				for k < len(elem) && isTchar(elem[k]) {
					k++
				}
				if k == j {
					return false
				}
				j = k
			}
			i = skipOWS(elem, j)
		}
		if i == len(elem) {
			return true
		}
		if elem[i] != ';' {
			return false
		}
		i++
	}
}

// endQuoted returns the index after the quoted string that starts at s[i],
// or -1 if it is not terminated or holds a byte a quoted string may not.
func endQuoted(s string, i int) int {
	for i++; i < len(s); i++ {
		c := s[i]
		if c == '\\' {
			i++
			if i == len(s) {
				return -1
			}
			c = s[i]
		} else if c == '"' {
			return i + 1
		}
		if (c < ' ' && c != '\t') || c == 0x7f {
			return -1
		}
	}
	return -1
}

// skipOWS returns the index of the first byte of s from i that is not a
// space or a tab.
func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// hasForwardedElement reports whether lines hold a valid forwarded-element.
func hasForwardedElement(lines []string) bool {
	return hasElement(lines, nextForwardedElement, validElement)
}

// joinForwarded returns the valid elements of lines, verbatim, followed by
// elem, separated by ", ".
func joinForwarded(lines []string, elem []byte) string {
	n := 0
	for _, line := range lines {
		for s := line; s != ""; {
			var e string
			e, s = nextForwardedElement(s)
			if validElement(e) {
				n += len(e) + len(", ")
			}
		}
	}
	if n == 0 {
		return string(elem)
	}
	var sb strings.Builder
	sb.Grow(n + len(elem))
	for _, line := range lines {
		for s := line; s != ""; {
			var e string
			e, s = nextForwardedElement(s)
			if validElement(e) {
				sb.WriteString(e)
				sb.WriteString(", ")
			}
		}
	}
	sb.Write(elem)
	return sb.String()
}
