package acme

import (
	"strings"
	"testing"
)

// TestDirectoryPrefix: the Cache keys of Let's Encrypt's production
// directory, the default, are autocert's own, however its URL is spelled;
// any other directory's start with a form of its URL that is a safe file
// name.
func TestDirectoryPrefix(t *testing.T) {
	for dir, want := range map[string]string{
		"": "",
		"https://acme-v02.api.letsencrypt.org/directory":           "",
		"https://acme-v02.api.letsencrypt.org/directory/":          "",
		"https://ACME-v02.api.letsencrypt.org:443/directory":       "",
		"https://acme-staging-v02.api.letsencrypt.org/directory":   "acme-staging-v02.api.letsencrypt.org-directory+",
		"https://127.0.0.1:14000/dir":                              "127.0.0.1-14000-dir+",
		"https://acme.zerossl.com/v2/DV90":                         "acme.zerossl.com-v2-DV90+",
		"https://ca.example.test/acme/directory?tenant=a b":        "ca.example.test-acme-directory-tenant-a-b+",
		"https://[::1]:14000/dir":                                  "1--14000-dir+",
		"https://acme-v02.api.letsencrypt.org:8443/directory":      "acme-v02.api.letsencrypt.org-8443-directory+",
		"http://acme-staging-v02.api.letsencrypt.org:80/directory": "acme-staging-v02.api.letsencrypt.org-directory+",
	} {
		if got := directoryPrefix(dir); got != want {
			t.Errorf("directoryPrefix(%q) = %q, want %q", dir, got, want)
		}
	}
}

// TestCacheKeysSafe: whatever a directory URL or an edge's ID holds, its
// keys are safe file names (no separator, not "." or "..", no leading
// dot), of bounded length, and long ones stay apart.
func TestCacheKeysSafe(t *testing.T) {
	long := "https://ca.example.test/" + strings.Repeat("a", 300)
	inputs := []string{
		"../../etc/passwd", "https://ca.example.test/../../../etc", "https://ca.example.test/%2e%2e/%2f",
		"\x00", "..", ".", "/", "\\\\server\\share", "https://ca.example.test/\u00e9\u200b", " ", "+", "-.-",
		long, long + "b", "https://" + strings.Repeat("h", 300) + "/dir",
	}
	seen := map[string]string{}
	for _, in := range inputs {
		for _, key := range []string{strings.TrimSuffix(directoryPrefix(in), "+"), strings.TrimPrefix(budgetKeyOf(in), "tunnelkit+acme_budget+")} {
			if key == "" || key == "." || key == ".." || strings.HasPrefix(key, ".") || len(key) > maxSafeKey {
				t.Errorf("%q: key %q", in, key)
			}
			for _, c := range []byte(key) {
				if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
					t.Errorf("%q: key %q holds %q", in, key, c)
				}
			}
		}
		p := directoryPrefix(in)
		if other, ok := seen[p]; ok && len(in) > maxSafeKey {
			t.Errorf("%q and %q: both %q", in, other, p)
		}
		seen[p] = in
	}
}
