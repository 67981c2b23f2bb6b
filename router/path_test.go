package router

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/urlpath"
)

func TestTablePaths(t *testing.T) {
	var tb Table[string]
	must(t, tb.Add("app.test", "root"))
	must(t, tb.AddAt("app.test", "/api", "api"))
	must(t, tb.AddAt("app.test", "/api/v2/", "v2"))
	must(t, tb.AddAt("*.wild.test", "/x", "wild-x"))
	for _, c := range []struct{ host, path, want string }{
		{"app.test", "/", "root"},
		{"app.test", "/api", "api"},
		{"app.test", "/api/", "api"},
		{"app.test", "/api/x", "api"},
		{"app.test", "/api/v2", "v2"},
		{"app.test", "/api/v2/x/y", "v2"},
		{"app.test", "/apix", "root"},
		{"app.test", "/api%2Fv2", "root"},
		{"APP.test.", "/api", "api"},
		{"a.wild.test", "/x/1", "wild-x"},
		{"a.wild.test", "/", ""},
		{"app.test", "/" + strings.Repeat("a/", 5000), "root"},
		{"app.test", "/api/" + strings.Repeat("a", 5000), "api"},
	} {
		got := slices.Collect(tb.BackendsAt(c.host, c.path))
		want := []string{c.want}
		if c.want == "" {
			want = nil
		}
		if !slices.Equal(got, want) {
			t.Errorf("BackendsAt(%q, %.40q) = %q, want %q", c.host, c.path, got, want)
		}
	}
	if got := slices.Collect(tb.Backends("app.test")); !slices.Equal(got, []string{"root", "api", "v2"}) {
		t.Errorf("Backends = %q, want the root's, then each path's", got)
	}
	if got := tb.Paths("app.test"); !slices.Equal(got, []string{"", "/api", "/api/v2"}) {
		t.Errorf("Paths = %q", got)
	}
	if got := tb.PoolAt("app.test", "/api/v2"); !slices.Equal(got, []string{"v2"}) {
		t.Errorf("PoolAt(/api/v2) = %q", got)
	}
	if err := tb.AddAt("app.test", "api", "x"); err == nil {
		t.Error("AddAt of a path without a leading / succeeded")
	}

	// A backend in pools of two paths is removed from both; a site left
	// with paths only answers nothing for other paths.
	must(t, tb.AddAt("app.test", "/other", "api"))
	if n := tb.RemoveBackend("api"); n != 2 {
		t.Errorf("RemoveBackend = %d, want 2", n)
	}
	if !tb.Remove("app.test", "root") {
		t.Fatal("Remove(root) = false")
	}
	if got := slices.Collect(tb.BackendsAt("app.test", "/api/x")); len(got) != 0 {
		t.Errorf("BackendsAt(/api/x) = %q after /api went, want none", got)
	}
	if got, ok := tb.Match("app.test"); !ok || got != "app.test" {
		t.Errorf("Match = %q, %v; want the name, which has /api/v2 still", got, ok)
	}
	if !tb.RemoveAt("app.test", "/api/v2", "v2") {
		t.Fatal("RemoveAt(/api/v2) = false")
	}
	if tb.Has("app.test") || len(tb.Names()) != 1 {
		t.Errorf("a name left with no pool is still there: Names = %q", tb.Names())
	}
}

// naiveMatch is the reference of site.match: of every prefix path is
// under, the longest.
func naiveMatch(prefixes []string, path string) string {
	best := ""
	found := false
	for _, p := range prefixes {
		if urlpath.Under(path, p) && len(p) >= len(best) {
			best, found = p, true
		}
	}
	if !found {
		return "none"
	}
	return best
}

// FuzzTablePaths holds BackendsAt to a naive longest-prefix match over
// every prefix bound, for prefixes and request paths the fuzzer makes,
// cleaned as the edge cleans them.
func FuzzTablePaths(f *testing.F) {
	f.Add("/api,/api/v2,/", "/api/v2/x")
	f.Add("/api", "/apix")
	f.Add("/api", "/api%2Fx")
	f.Add("/a/b,/a", "//a/./b/../b/c")
	f.Add("/pkg.Service/", "/pkg.Service/Method")
	f.Add("/%61pi,/API", "/api/../API/x")
	f.Fuzz(func(t *testing.T, prefixes, path string) {
		var tb Table[string]
		var bound []string
		for _, p := range strings.Split(prefixes, ",") {
			n, ok := NormalisePath(p)
			if !ok {
				continue
			}
			if err := tb.AddAt("x.test", n, "b"+n); err != nil {
				t.Fatalf("AddAt(%q): %v", n, err)
			}
			bound = append(bound, n)
		}
		clean := CleanPath(path)
		got := "none"
		for b := range tb.BackendsAt("x.test", clean) {
			got = strings.TrimPrefix(b, "b")
		}
		if want := naiveMatch(bound, clean); got != want {
			t.Fatalf("prefixes %q, path %q (%q): BackendsAt chose %q, want %q", bound, path, clean, got, want)
		}
	})
}

// BenchmarkBackendsAt compares a request's lookup in a name with no paths
// and in a name with 50.
func BenchmarkBackendsAt(b *testing.B) {
	var none, fifty Table[string]
	none.Add("app.test", "root")
	fifty.Add("app.test", "root")
	for i := range 50 {
		if err := fifty.AddAt("app.test", fmt.Sprintf("/svc%d/v%d", i, i%3), "b"); err != nil {
			b.Fatal(err)
		}
	}
	path := CleanPath("/svc42/v0/users/123")
	for _, c := range []struct {
		name string
		t    *Table[string]
	}{{"paths=0", &none}, {"paths=50", &fifty}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for r := range c.t.BackendsAt("app.test", path) {
					_ = r
				}
			}
		})
	}
}
