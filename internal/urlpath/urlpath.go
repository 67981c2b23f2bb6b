// Package urlpath cleans the paths of HTTP requests for routing by path
// prefix: a request's path with its dot segments resolved, as a browser
// resolves them, and its percent-encoding normalised (RFC 3986, 6.2.2), so
// that a route's prefix matches what the app will read, however the client
// spelled it.
//
// Matching is on segments, split on "/" alone: "%2F" is part of a segment,
// never a separator. A prefix "/api" takes "/api", "/api/" and "/api/x",
// never "/apix" or "/api%2Fx". Case matters.
package urlpath

import (
	"errors"
	"fmt"
	"strings"
)

// MaxPrefixBytes bounds a prefix, as Prefix returns it: a lookup never
// tries a longer part of a request's path.
const MaxPrefixBytes = 1024

// Clean returns p, a path as a request carries it (percent-encoded, as
// url.URL.EscapedPath returns it), in the form that prefixes match:
//
//   - empty segments are dropped: "//api" is "/api";
//   - "." and ".." segments are resolved, spelled with "%2e" too:
//     "/api/../admin" is "/admin", "/.." is "/";
//   - escapes of unreserved characters (letters, digits, "-", ".", "_",
//     "~") are decoded, other escapes written in upper case ("%2f" is
//     "%2F", which stays part of its segment), and bytes a path does not
//     carry as they are (a space, a control, a non-ASCII byte, a "%"
//     that starts no escape) are escaped;
//   - a trailing slash stays, and resolving "." or ".." last leaves one:
//     "/api/" and "/api/." are "/api/".
//
// A p that does not start with "/" (the asterisk form of OPTIONS, the
// authority form of CONNECT) is "/". The result starts with "/" and is
// its own Clean. A path that needs no change is returned as it is,
// without allocating.
func Clean(p string) string {
	if len(p) == 0 || p[0] != '/' {
		return "/"
	}
	if isClean(p) {
		return p
	}
	var segs []string
	var buf []byte
	trailing := false
	for rest := p[1:]; ; {
		seg, more, found := strings.Cut(rest, "/")
		buf = normalise(buf[:0], seg)
		switch s := string(buf); s {
		case "", ".":
			trailing = true
		case "..":
			trailing = true
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			trailing = false
			segs = append(segs, s)
		}
		if !found {
			break
		}
		rest = more
	}
	if len(segs) == 0 {
		return "/"
	}
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(s)
	}
	if trailing {
		b.WriteByte('/')
	}
	return b.String()
}

// isClean reports whether Clean(p), for p starting with "/", is p: no
// empty, "." or ".." segment but a last empty one, and every byte in its
// normal form.
func isClean(p string) bool {
	start := 1 // of the segment
	for i := 1; i <= len(p); i++ {
		if i < len(p) && p[i] != '/' {
			c := p[i]
			switch {
			case c == '%':
				if i+2 >= len(p) || !upperHex(p[i+1]) || !upperHex(p[i+2]) || unreserved(unhex(p[i+1])<<4|unhex(p[i+2])) {
					return false
				}
				i += 2
			case !literal(c):
				return false
			}
			continue
		}
		switch seg := p[start:i]; {
		case seg == "" && i < len(p), seg == ".", seg == "..":
			return false
		}
		start = i + 1
	}
	return true
}

// normalise appends seg, a segment, to b in normal form: unreserved
// characters decoded, other escapes in upper case, bytes a path does not
// carry as they are escaped.
func normalise(b []byte, seg string) []byte {
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' && i+2 < len(seg) && isHex(seg[i+1]) && isHex(seg[i+2]) {
			d := unhex(seg[i+1])<<4 | unhex(seg[i+2])
			if unreserved(d) {
				b = append(b, d)
			} else {
				b = append(b, '%', upper(seg[i+1]), upper(seg[i+2]))
			}
			i += 2
			continue
		}
		if c != '%' && literal(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return b
}

// Prefix returns p, the path of an endpoint ("/api", "/api/"), as routes
// keep it: Clean's form without its trailing slash, "" for "/" (the whole
// name) and for "". It fails for a path that does not start with "/",
// that holds a byte outside printable ASCII, a space, "?" or "#" (a path
// is given percent-encoded), or a "%" that starts no escape, and for one
// longer than MaxPrefixBytes once cleaned.
func Prefix(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if p[0] != '/' {
		return "", fmt.Errorf("%w %q: want one that starts with /", ErrInvalid, printable(p))
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c <= ' ' || c >= 0x7f:
			return "", fmt.Errorf("%w %q: byte %#02x must be percent-encoded", ErrInvalid, printable(p), c)
		case c == '?' || c == '#':
			return "", fmt.Errorf("%w %q: a path prefix has no query or fragment", ErrInvalid, printable(p))
		case c == '%' && (i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2])):
			return "", fmt.Errorf("%w %q: %% starts no escape (write it %%25)", ErrInvalid, printable(p))
		}
	}
	c := strings.TrimSuffix(Clean(p), "/")
	if len(c) > MaxPrefixBytes {
		return "", fmt.Errorf("%w: %d bytes (at most %d)", ErrInvalid, len(c), MaxPrefixBytes)
	}
	return c, nil
}

// ErrInvalid is the error Prefix's errors wrap.
var ErrInvalid = errors.New("invalid path")

// Under reports whether the cleaned path p is prefix, as Prefix returns
// it, or a path under it, on segment boundaries: "/api" holds "/api",
// "/api/" and "/api/x", never "/apix". Every path is under "".
func Under(p, prefix string) bool {
	rest, ok := strings.CutPrefix(p, prefix)
	return ok && (rest == "" || rest[0] == '/')
}

// Strip returns the cleaned path p, under prefix (see Under), without
// prefix: what an app mounted at prefix reads, always starting with "/":
// "/api" and "/api/" are "/", "/api/x/" is "/x/".
func Strip(p, prefix string) string {
	rest := p[len(prefix):]
	if rest == "" {
		return "/"
	}
	return rest
}

// literal reports whether c stands for itself in a normal path segment:
// RFC 3986's pchar but for escapes (unreserved, sub-delims, ":" and "@").
func literal(c byte) bool {
	if unreserved(c) {
		return true
	}
	switch c {
	case '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@':
		return true
	}
	return false
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func upperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

const hexDigits = "0123456789ABCDEF"

// printable is p cut short for an error message; its bytes are quoted
// by %q.
func printable(p string) string {
	if len(p) > 100 {
		return p[:100] + "..."
	}
	return p
}
