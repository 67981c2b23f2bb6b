package policy

import (
	"io"
	"net/http"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// headerOps is a compiled Headers: canonical names to remove, and values to
// set, each a slice with no spare capacity, shared by every request, so
// that applying them allocates nothing (a later append copies).
type headerOps struct {
	remove []string
	set    []headerSet
}

type headerSet struct {
	name   string
	values []string
}

func newHeaderOps(h *Headers) *headerOps {
	if h == nil {
		return nil
	}
	ops := new(headerOps)
	for _, name := range h.Remove {
		ops.remove = append(ops.remove, http.CanonicalHeaderKey(name))
	}
	byName := map[string]int{}
	for _, a := range h.Add {
		name, value, _ := strings.Cut(a, ":")
		name = http.CanonicalHeaderKey(name)
		value = strings.TrimSpace(value)
		i, ok := byName[name]
		if !ok {
			i = len(ops.set)
			byName[name] = i
			ops.set = append(ops.set, headerSet{name: name})
		}
		ops.set[i].values = append(ops.set[i].values, value)
	}
	for i := range ops.set {
		ops.set[i].values = slices.Clip(ops.set[i].values)
	}
	return ops
}

// apply removes, then sets.
func (ops *headerOps) apply(h http.Header) {
	if ops == nil {
		return
	}
	for _, name := range ops.remove {
		delete(h, name)
	}
	for _, s := range ops.set {
		h[s.name] = s.values
	}
}

// nameKind is what a header's name is to the edge.
type nameKind uint8

const (
	nameOther      nameKind = iota
	nameOwn                 // Tunnelkit-*: the edge's own
	nameForwarding          // X-Forwarded-* and Forwarded: the hops the edge appends to
)

// kindOfName returns the kind of a header named name as app stacks read
// it, with '_' and '.' as '-' and the case folded (ASCII): CGI and PHP,
// Rack, older Puma and gunicorn read Tunnelkit_Auth_User and
// Tunnelkit.Auth.User as Tunnelkit-Auth-User (HTTP_TUNNELKIT_AUTH_USER).
func kindOfName(name string) nameKind {
	switch {
	case readsAs(name, "tunnelkit-", true):
		return nameOwn
	case readsAs(name, "x-forwarded-", true), readsAs(name, "forwarded", false):
		return nameForwarding
	}
	return nameOther
}

// readsAs reports whether name reads as want (lower case, '-' between
// words), or as a name that starts with want when prefix, with '_' and
// '.' as '-' and the case folded.
func readsAs(name, want string, prefix bool) bool {
	if len(name) < len(want) || !prefix && len(name) != len(want) {
		return false
	}
	for i := 0; i < len(want); i++ {
		c := name[i]
		switch {
		case c == '_' || c == '.':
			c = '-'
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}

// canonicalName reports whether name is spelled as the edge spells the
// headers it handles: a token without '_' or '.', in canonical form
// (X-Forwarded-For, Forwarded).
func canonicalName(name string) bool {
	return httpguts.ValidHeaderFieldName(name) && !strings.ContainsAny(name, "_.") && http.CanonicalHeaderKey(name) == name
}

// stripReserved removes from h, the header of a request on its way to the
// app, every header named like one the edge reserves or sets, however
// spelled (a client may send names that are not canonical through HTTP/2
// or a hand-made http.Header): every Tunnelkit-* name, and every
// X-Forwarded-* and Forwarded name but in its canonical spelling, which
// the edge appends to (see package forwarded).
func stripReserved(h http.Header) {
	for name := range h {
		switch kindOfName(name) {
		case nameOwn:
			delete(h, name)
		case nameForwarding:
			if !canonicalName(name) {
				delete(h, name)
			}
		}
	}
}

// stripReservedTrailers removes from t, the trailers of a request, every
// one named like a header the edge reserves or sets, however spelled: no
// trailer is a hop the edge appends to.
func stripReservedTrailers(t http.Header) {
	for name := range t {
		if kindOfName(name) != nameOther {
			delete(t, name)
		}
	}
}

// holdTrailers holds the trailers of r, a request on its way to the app,
// to stripReservedTrailers: those announced now, and those that come at
// the end of the body (net/http adds them to r.Trailer as the body's last
// read returns io.EOF: announced or not over HTTP/1.1, announced over
// HTTP/2) as it ends.
func holdTrailers(r *http.Request) {
	stripReservedTrailers(r.Trailer)
	if r.Body == nil || r.Body == http.NoBody || r.Trailer == nil && (r.ContentLength >= 0 || r.ProtoMajor >= 2) {
		return // no trailer to come: none announced, and not chunked
	}
	r.Body = &trailerGuard{ReadCloser: r.Body, r: r}
}

// trailerGuard is the body of a request that may have trailers: as it
// ends, it removes from them those named like a header the edge reserves
// or sets, before the reader of the body (the edge's proxy) sends them on.
type trailerGuard struct {
	io.ReadCloser
	r *http.Request
}

func (b *trailerGuard) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		stripReservedTrailers(b.r.Trailer)
	}
	return n, err
}
