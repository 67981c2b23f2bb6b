package edge

// Routing by path: an http or https endpoint may take a path prefix under
// its name (wire.OptPath, router.Route.Path). The Router picks a request's
// routes by its cleaned path (router.PathRouter); the edge sends the app
// the path it matched on, without the prefix when the route strips it.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/urlpath"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// headerForwardedPrefix is the header that tells an app the prefix the edge
// took off a request's path.
const headerForwardedPrefix = "X-Forwarded-Prefix"

// pathOptions sets r's Path and StripPrefix from a bind's options (every
// other option is endpointOptions'), or says why the bind cannot have
// them. rawPolicy is the bind's policy, as it came.
func (s *Server) pathOptions(r *router.Route, opts map[string]string, rawPolicy []byte) error {
	r.Path, r.StripPrefix = "", false
	raw, withPath := opts[wire.OptPath]
	strip, withStrip := opts[wire.OptStripPrefix]
	if !withPath && !withStrip {
		return nil
	}
	if r.Proto != wire.ProtoHTTP && r.Proto != wire.ProtoHTTPS {
		k := wire.OptPath
		if !withPath {
			k = wire.OptStripPrefix
		}
		return fmt.Errorf("option %s is for http and https endpoints: a %s endpoint's connections carry no request path the edge could route by", k, wire.Printable(r.Proto, 16))
	}
	if withStrip {
		switch strip {
		case "true":
			r.StripPrefix = true
		case "false":
		default:
			return fmt.Errorf("option %s: %q: want true or false", wire.OptStripPrefix, wire.Printable(strip, 32))
		}
	}
	p, err := urlpath.Prefix(raw)
	if err != nil {
		return fmt.Errorf("option %s: %v", wire.OptPath, err)
	}
	if p == "" && r.StripPrefix {
		return fmt.Errorf("option %s needs a path prefix to strip (option %s, not /)", wire.OptStripPrefix, wire.OptPath)
	}
	if p == "" {
		return nil
	}
	if _, ok := s.router().(router.PathRouter); !ok {
		return errors.New("this edge's router does not route by path (router.PathRouter): bind the whole name")
	}
	if len(rawPolicy) > 0 {
		if spec, err := policy.Parse(rawPolicy); err == nil && spec.OIDC != nil {
			return fmt.Errorf("an oidc login on an endpoint with a path (%s): its callback, %s, is one for the whole name; put the login on the name's endpoint without a path", p, policy.CallbackPath)
		}
	}
	r.Path = p
	return nil
}

// lookupPath asks the Router for the routes of a request for name over
// proto whose cleaned path is path, as lookup asks for a name's.
func (s *Server) lookupPath(ctx context.Context, proto, name, path string) ([]router.Route, error) {
	if s.testHookLookup != nil {
		s.testHookLookup(ctx)
	}
	if s.Router == nil {
		return router.LookupPath(ctx, s.router(), proto, name, path)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg().handshake)
	defer cancel()
	return router.LookupPath(ctx, s.Router, proto, name, path)
}

// requestPath returns the path of r that routes match: router.CleanPath of
// its path as it came, percent-encoded. The query plays no part.
func requestPath(r *http.Request) string {
	return router.CleanPath(r.URL.EscapedPath())
}

// pathRequest returns the request to send the app of a route for r: r
// itself for a route without a Path; for one with a Path, a copy of r with
// the cleaned path the route was chosen by, without the route's Path when
// it strips it (the query kept), and X-Forwarded-Prefix set to the Path
// it strips, or removed (as a client sent it) when it strips none.
func pathRequest(r *http.Request, route router.Route) *http.Request {
	if route.Path == "" {
		return r
	}
	p := requestPath(r)
	if !urlpath.Under(p, route.Path) {
		return r // not a request the route was chosen for by path
	}
	delete(r.Header, headerForwardedPrefix)
	if route.StripPrefix {
		p = urlpath.Strip(p, route.Path)
		r.Header[headerForwardedPrefix] = []string{route.Path}
		keepHeader(r.Header, headerForwardedPrefix)
	}
	if p == r.URL.EscapedPath() {
		return r
	}
	out := r.WithContext(r.Context())
	u := *r.URL
	u.Path, _ = url.PathUnescape(p) // p is CleanPath's: its escapes are valid
	u.RawPath = p
	out.URL = &u
	return out
}

// keepHeader takes name off the Connection header of h, so that the proxy
// does not remove the value the edge set, as a hop-by-hop header the
// client named.
func keepHeader(h http.Header, name string) {
	vals, ok := h["Connection"]
	if !ok {
		return
	}
	var keep []string
	for _, v := range vals {
		for t := range strings.SplitSeq(v, ",") {
			if t = textproto.TrimString(t); t != "" && !strings.EqualFold(t, name) {
				keep = append(keep, t)
			}
		}
	}
	if len(keep) == 0 {
		delete(h, "Connection")
		return
	}
	h["Connection"] = []string{strings.Join(keep, ", ")}
}
