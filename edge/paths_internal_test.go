package edge

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/urlpath"
	"github.com/tunnelkit/tunnelkit/router"
)

// FuzzPathRequest checks the request an app of a path gets, for request
// targets and prefixes the fuzzer makes: its path is the cleaned path
// (without the prefix when stripped, always from "/"), which reads back
// as it was written; the query is kept; X-Forwarded-Prefix is the
// prefix when stripped, else none; the public request is left as it came
// but for X-Forwarded-Prefix.
func FuzzPathRequest(f *testing.F) {
	for _, s := range []string{"/api/x?q=1", "/api", "/api/", "//api/../api/x", "/api%2Fx", "/%61pi/v2", "/api/x%20y", "/api/caf%C3%A9", "*", "/api/%2e%2e"} {
		f.Add(s, "/api", true)
		f.Add(s, "/api", false)
	}
	f.Fuzz(func(t *testing.T, target, prefix string, strip bool) {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return // net/http answers 400
		}
		p, ok := router.NormalisePath(prefix)
		if !ok || p == "" {
			return
		}
		r := &http.Request{Method: "GET", URL: u, Header: http.Header{"X-Forwarded-Prefix": {"/client"}}, RequestURI: target}
		before := r.URL.String()
		clean := requestPath(r)
		out := pathRequest(r, router.Route{Path: p, StripPrefix: strip})
		if r.URL.String() != before {
			t.Fatalf("the public request changed: %q, was %q", r.URL.String(), before)
		}
		if !urlpath.Under(clean, p) {
			if out != r {
				t.Fatalf("%q is not under %q, yet the request changed", clean, p)
			}
			return
		}
		want := clean
		if strip {
			want = urlpath.Strip(clean, p)
		}
		got := out.URL.EscapedPath()
		if got != want {
			t.Fatalf("target %q, prefix %q (strip %v): the app's path is %q, want %q", target, p, strip, got, want)
		}
		back, err := url.ParseRequestURI(out.URL.RequestURI())
		if err != nil || back.EscapedPath() != want || back.RawQuery != u.RawQuery {
			t.Fatalf("target %q: the app reads %q back as %v, %v; want path %q, query %q", target, out.URL.RequestURI(), back, err, want, u.RawQuery)
		}
		xfp := out.Header.Values("X-Forwarded-Prefix")
		if strip && (len(xfp) != 1 || xfp[0] != p) || !strip && len(xfp) != 0 {
			t.Fatalf("strip %v: X-Forwarded-Prefix %q", strip, xfp)
		}
		if !strings.HasPrefix(got, "/") {
			t.Fatalf("the app's path %q does not start with /", got)
		}
	})
}
