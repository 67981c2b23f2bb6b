// Routing by path: the routes of one name under different path prefixes.

package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/tunnelkit/tunnelkit/internal/urlpath"
)

// PathRouter is implemented by Routers that route http and https requests
// by path prefix under one name (Route.Path): router.MemoryRouter and
// router/etcdrouter. An edge binds a route with a Path only through a
// Router that implements it, and asks it, not Lookup, for each HTTP
// request's routes. So a Router that embeds a PathRouter (a
// MemoryRouter) and answers Lookup otherwise must answer LookupPath
// likewise, or the method its embedded Router lends it answers instead.
type PathRouter interface {
	// LookupPath returns the routes for proto and host, as Lookup does,
	// of the longest Path of that pattern that path is under, on segment
	// boundaries ("/api" takes "/api", "/api/" and "/api/x", never
	// "/apix"), else of the routes without a Path. path is a request's
	// path as CleanPath returns it. No route is an empty slice and a nil
	// error; that is the answer too for a path that no route of the most
	// specific pattern takes, whatever a less specific pattern has.
	LookupPath(ctx context.Context, proto, host, path string) ([]Route, error)
}

// LookupPath returns the routes of r for a request of proto and host whose
// path, as CleanPath returns it, is path: r's LookupPath, or for a Router
// that does not route by path, its Lookup.
func LookupPath(ctx context.Context, r Router, proto, host, path string) ([]Route, error) {
	if pr, ok := r.(PathRouter); ok {
		return pr.LookupPath(ctx, proto, host, path)
	}
	return r.Lookup(ctx, proto, host)
}

// MaxPathBytes bounds a Route's Path.
const MaxPathBytes = urlpath.MaxPrefixBytes

// ErrInvalidPath is returned, wrapped, by a PathRouter's Bind for a route
// whose Path is not one NormalisePath takes, or that has one while its
// Proto is neither http nor https.
var ErrInvalidPath = errors.New("router: invalid path")

// CleanPath returns the path of a request (percent-encoded, as
// url.URL.EscapedPath returns it) in the form routes match: its dot
// segments resolved as a browser resolves them ("/api/../admin" is
// "/admin", spelled with "%2e" too), empty segments dropped ("//api" is
// "/api"), escapes of unreserved characters decoded ("/%61pi" is "/api")
// and others in upper case; "%2F" stays within its segment. A trailing
// slash stays. A path that does not start with "/" is "/". A path that
// needs no change is returned as it is, without allocating.
func CleanPath(path string) string { return urlpath.Clean(path) }

// NormalisePath returns the path prefix of an endpoint as a Route keeps
// it: CleanPath's form without its trailing slash ("/api/" is "/api"), and
// "" for "/" and "". ok is false for a path that does not start with "/",
// holds a byte a path carries only percent-encoded (a space, a control,
// non-ASCII), a "?", a "#" or a "%" that starts no escape, or is longer
// than MaxPathBytes once cleaned.
func NormalisePath(path string) (string, bool) {
	p, err := urlpath.Prefix(path)
	return p, err == nil
}

// RoutePath returns r's Path as a PathRouter keeps it (NormalisePath's
// form), or an error wrapping ErrInvalidPath when r cannot have it: not a
// path NormalisePath takes, or one on a route neither http nor https.
func RoutePath(r Route) (string, error) {
	if r.Path == "" {
		return "", nil
	}
	if r.Proto != "http" && r.Proto != "https" {
		return "", fmt.Errorf("%w: %s %s: a path routes http and https requests only", ErrInvalidPath, r.Proto, r.Name)
	}
	p, err := urlpath.Prefix(r.Path)
	if err != nil {
		return "", fmt.Errorf("%w: %s %s: %v", ErrInvalidPath, r.Proto, r.Name, err)
	}
	return p, nil
}
