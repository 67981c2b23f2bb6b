package h1

import (
	"bytes"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
)

// fields is what a head's header fields say about the message's framing.
type fields struct {
	length  int64 // the Content-Length, or -1 if there is none
	te      bool  // a Transfer-Encoding field is present (and counts: HTTP/1.1 and later)
	chunked bool  // the last transfer coding is chunked
	upgrade bool  // an Upgrade field is present
}

// line splits the first line off b, without its line ending ("\r\n" or "\n").
func line(b []byte) (first, rest []byte) {
	first, rest, _ = bytes.Cut(b, []byte("\n"))
	first, _ = bytes.CutSuffix(first, []byte("\r"))
	return first, rest
}

// version parses an HTTP version as net/http does and reports whether it
// is at least HTTP/1.1, under which Transfer-Encoding is ignored.
func version(b []byte) (atLeast11 bool, err error) {
	major, minor, ok := http.ParseHTTPVersion(string(b))
	if !ok {
		return false, fmt.Errorf("%w: bad HTTP version %q", ErrMalformed, b)
	}
	return major > 1 || major == 1 && minor >= 1, nil
}

// requestLine parses "METHOD SP target SP version", split as net/http does.
func requestLine(b []byte) (method, target []byte, atLeast11 bool, err error) {
	method, rest, ok1 := bytes.Cut(b, []byte(" "))
	target, proto, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || len(method) == 0 || len(target) == 0 {
		return nil, nil, false, fmt.Errorf("%w: bad request line %q", ErrMalformed, b)
	}
	atLeast11, err = version(proto)
	return method, target, atLeast11, err
}

// statusLine parses "version SP status SP reason", split as net/http does,
// with a status of three digits.
func statusLine(b []byte) (status int, atLeast11 bool, err error) {
	proto, rest, ok := bytes.Cut(b, []byte(" "))
	code, _, _ := bytes.Cut(bytes.TrimLeft(rest, " "), []byte(" "))
	if !ok || len(code) != 3 || code[0] < '1' || code[0] > '9' {
		return 0, false, fmt.Errorf("%w: bad status line %q", ErrMalformed, b)
	}
	status, err = strconv.Atoi(string(code))
	if err != nil {
		return 0, false, fmt.Errorf("%w: bad status line %q", ErrMalformed, b)
	}
	atLeast11, err = version(proto)
	return status, atLeast11, err
}

// fieldIs reports whether a field name is name, an ASCII name, in any case.
// Equal lengths rule out the non-ASCII runes that fold to ASCII letters
// (such as U+017F, a long s), which are longer than one byte.
func fieldIs(field []byte, name string) bool {
	return len(field) == len(name) && bytes.EqualFold(field, []byte(name))
}

// readFields scans the header field lines of a head for the few fields
// that frame its body. Values are trimmed and obsolete line folding joined
// as net/textproto does. A Transfer-Encoding field counts only under
// HTTP/1.1 and later, as in net/http.
func readFields(b []byte, atLeast11 bool) (fields, error) {
	f := fields{length: -1}
	var name, value, joined []byte
	for len(b) > 0 || name != nil {
		var l []byte
		if len(b) > 0 {
			l, b = line(b)
			if len(l) == 0 { // the blank line ending the head
				b = nil
			}
		}
		if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') { // a continuation line
			if name == nil {
				return f, fmt.Errorf("%w: header section begins with a space", ErrMalformed)
			}
			if fieldIs(name, "Content-Length") || fieldIs(name, "Transfer-Encoding") {
				joined = append(append(append(joined[:0], value...), ' '), textproto.TrimBytes(l)...)
				value = joined
			}
			continue
		}
		if name != nil {
			if err := f.add(name, textproto.TrimBytes(value), atLeast11); err != nil {
				return f, err
			}
			name, value = nil, nil
		}
		if len(l) == 0 {
			continue
		}
		k, v, ok := bytes.Cut(textproto.TrimBytes(l), []byte(":"))
		if !ok {
			return f, fmt.Errorf("%w: header line without a colon: %q", ErrMalformed, l)
		}
		name, value = k, textproto.TrimBytes(v)
	}
	return f, nil
}

// add takes one header field into account.
func (f *fields) add(name, value []byte, atLeast11 bool) error {
	switch {
	case fieldIs(name, "Content-Length"):
		// A list of identical values is allowed (RFC 9110, section 8.6), as
		// are repeated fields with identical values (net/http).
		for elem := range bytes.SplitSeq(value, []byte(",")) {
			u, err := strconv.ParseUint(string(textproto.TrimBytes(elem)), 10, 63)
			n := int64(u)
			if err != nil || f.length >= 0 && n != f.length {
				return fmt.Errorf("%w: bad or conflicting Content-Length %q", ErrMalformed, value)
			}
			f.length = n
		}
	case fieldIs(name, "Transfer-Encoding"):
		if !atLeast11 {
			return nil
		}
		f.te = true
		for elem := range bytes.SplitSeq(value, []byte(",")) {
			if elem = textproto.TrimBytes(elem); len(elem) > 0 {
				f.chunked = bytes.EqualFold(elem, []byte("chunked"))
			}
		}
	case fieldIs(name, "Upgrade"):
		f.upgrade = true
	}
	return nil
}
