package etcdrouter

import (
	"encoding/json"
	"net/url"
	"strings"

	"github.com/tunnelkit/tunnelkit/router"
)

// keys are the etcd keys and key prefixes that binding or unbinding a route
// reads and writes (see the package doc for the layout).
type keys struct {
	base string // the pattern without "*."
	// tree is the prefix of the entries of base and, for host names, of
	// every name under it: "<prefix>host/test.example.abc." (a name under
	// it adds labels after the dot, so "test.example.abcd." is not in it).
	tree string
	// own is the prefix of the entries of base alone:
	// "<prefix>host/test.example.abc./".
	own string
	// above are the names above base, nearest first, and ancestors the
	// prefixes of their own entries: "<prefix>host/test.example./" and
	// "<prefix>host/test./" for abc.example.test. None for tcp.
	above, ancestors []string
	endpoint         string // the prefix of the entries of the route's Proto, Name and Path
	routes           string // the prefix of the routes of its Proto, Name and Path
	route            string // the route's key
	reserved         string // the key of its Proto, Name and Path's reservation
}

// keysOf returns the keys of rt, whose Name and Path are normalised and
// Edge set. The entries of a Path live apart from those of the whole name
// ("<pattern>/p/<path escaped>/..." beside "<pattern>/r/..."), so that an
// edge of before paths, which reads "<pattern>/r/..." alone, ignores them.
func (r *Router) keysOf(rt router.Route) keys {
	base := strings.TrimPrefix(rt.Name, "*.")
	ns := r.prefix + "host/"
	if rt.Proto == "tcp" {
		ns = r.prefix + "tcp/"
	}
	rb := reversed(base)
	k := keys{base: base, own: ns + rb + "/"}
	if rt.Proto == "tcp" {
		k.tree = k.own // only the same port conflicts
	} else {
		k.tree = ns + rb
		for rest := base; ; {
			i := strings.IndexByte(rest, '.')
			if i < 0 {
				break
			}
			rest = rest[i+1:]
			k.above = append(k.above, rest)
			k.ancestors = append(k.ancestors, ns+reversed(rest)+"/")
		}
	}
	k.endpoint = k.own + url.PathEscape(rt.Proto) + "/" + rt.Name + "/"
	if rt.Path != "" {
		k.endpoint += "p/" + url.PathEscape(rt.Path) + "/"
	}
	k.routes = k.endpoint + "r/"
	k.route = k.routes + url.PathEscape(rt.Edge) + "/" + url.PathEscape(rt.SessionID) + "/" + url.PathEscape(rt.TunnelID)
	k.reserved = k.endpoint + "reserved"
	return k
}

// memberKey returns the key that registers the edge id as a member.
func (r *Router) memberKey(id string) string {
	return r.prefix + "edges/" + url.PathEscape(id)
}

// memberOf returns the ID of the edge whose member key key is.
func (r *Router) memberOf(key string) (id string, ok bool) {
	escaped, ok := strings.CutPrefix(key, r.prefix+"edges/")
	if !ok || strings.Contains(escaped, "/") {
		return "", false
	}
	id, err := url.PathUnescape(escaped)
	return id, err == nil
}

// reversed returns a host name's labels in reverse order, each followed by a
// dot: "test.example.abc." for "abc.example.test".
func reversed(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 1)
	for end := len(name); end > 0; {
		i := strings.LastIndexByte(name[:end], '.')
		b.WriteString(name[i+1 : end])
		b.WriteByte('.')
		end = max(i, 0)
	}
	return b.String()
}

// isRoute reports whether key, under the Router's prefix, is a route's
// rather than a reservation's: its fifth segment is "r", or it is "p" and
// its seventh "r" (namespace, reversed base, proto, pattern and escaped
// path hold no "/").
func (r *Router) isRoute(key string) bool {
	rest, ok := strings.CutPrefix(key, r.prefix)
	if !ok {
		return false
	}
	for range 4 {
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return false
		}
		rest = rest[i+1:]
	}
	if path, ok := strings.CutPrefix(rest, "p/"); ok {
		i := strings.IndexByte(path, '/')
		if i < 0 {
			return false
		}
		rest = path[i+1:]
	}
	return strings.HasPrefix(rest, "r/")
}

// record is an entry's value: a route, or a reservation's Proto, Name and
// Identity. Its fields are router.Route's, in order, so that one converts to
// the other.
type record struct {
	Proto         string `json:"proto"`
	Name          string `json:"name"`
	TunnelID      string `json:"tunnel,omitempty"`
	SessionID     string `json:"session,omitempty"`
	Identity      string `json:"identity"`
	Edge          string `json:"edge,omitempty"`
	Path          string `json:"path,omitempty"`
	StripPrefix   bool   `json:"strip_prefix,omitempty"`
	Pool          bool   `json:"pool,omitempty"`
	AppProtocol   string `json:"app_protocol,omitempty"`
	Policy        string `json:"policy,omitempty"` // the JSON of a policy.Spec, as a string; secrets included
	VerboseErrors bool   `json:"verbose_errors,omitempty"`
	Admits        bool   `json:"admits,omitempty"`
}

func encode(rt router.Route) string {
	b, _ := json.Marshal(record(rt)) // cannot fail: strings and bools
	return string(b)
}

func encodeReservation(rt router.Route) string {
	return encode(router.Route{Proto: rt.Proto, Name: rt.Name, Path: rt.Path, Identity: rt.Identity})
}

func decode(b []byte) (router.Route, error) {
	var rec record
	err := json.Unmarshal(b, &rec)
	return router.Route(rec), err
}
