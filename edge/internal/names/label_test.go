package names

import (
	"strings"
	"testing"
)

// FuzzCheck: Check, which reads the names agents send, never panics; a name
// it accepts is lower case, under the domain, at most 253 bytes, and
// accepted again as it is; a catch-all only with catchAll.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"abc", "ABC.example.test.", "*.abc", "*", "*.example.test", "xn--pple-43d", "xn--80ak6aa92e",
		"a--b", "-a", "a.b.c", strings.Repeat("a", 64), strings.Repeat("a.", 130), "a..b", "é", "a_b", ""} {
		f.Add(s, false)
		f.Add(s, true)
	}
	const domain = "example.test"
	f.Fuzz(func(t *testing.T, req string, catchAll bool) {
		name, err := Check(req, domain, catchAll)
		if err != nil {
			return
		}
		if name != strings.ToLower(name) || !strings.HasSuffix(name, "."+domain) || len(name) > 253 {
			t.Fatalf("Check(%q) = %q", req, name)
		}
		if name == "*."+domain && !catchAll {
			t.Fatalf("Check(%q) gave the catch-all without catchAll", req)
		}
		if again, err := Check(name, domain, catchAll); err != nil || again != name {
			t.Fatalf("Check(%q) = %q, and again %q, %v", req, name, again, err)
		}
	})
}
