package urlpath

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestClean(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"/", "/"},
		{"", "/"},
		{"*", "/"},
		{"example.com:443", "/"},
		{"/api", "/api"},
		{"/api/", "/api/"},
		{"/api/x", "/api/x"},
		{"//api", "/api"},
		{"///api//x//", "/api/x/"},
		{"/api/../admin", "/admin"},
		{"/api/./x", "/api/x"},
		{"/api/.", "/api/"},
		{"/api/..", "/"},
		{"/a/b/..", "/a/"},
		{"/..", "/"},
		{"/../../etc/passwd", "/etc/passwd"},
		{"/api/%2e%2e/admin", "/admin"},
		{"/api/%2E%2e/admin", "/admin"},
		{"/api/.%2e/admin", "/admin"},
		{"/api/%2e/x", "/api/x"},
		{"/api%2Fx", "/api%2Fx"},
		{"/api%2fx", "/api%2Fx"},
		{"/api/..%2Fadmin", "/api/..%2Fadmin"},
		{"/%61pi", "/api"},
		{"/%7Euser", "/~user"},
		{"/API", "/API"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/caf\xc3\xa9", "/caf%C3%A9"},
		{"/a b", "/a%20b"},
		{"/100%", "/100%25"},
		{"/100%zz", "/100%25zz"},
		{"/a;b=c/d:e@f!$&'()*+,", "/a;b=c/d:e@f!$&'()*+,"},
		{"/a%3Bb", "/a%3Bb"},
		{"/a\\b", "/a%5Cb"},
		{"/a?b", "/a%3Fb"},
	} {
		if got := Clean(c.in); got != c.want {
			t.Errorf("Clean(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := Clean(c.want); got != c.want {
			t.Errorf("Clean(%q) = %q: not its own Clean", c.want, got)
		}
	}
}

func TestCleanDoesNotAllocateForCleanPaths(t *testing.T) {
	for _, p := range []string{"/", "/api", "/api/v2/users/123", "/api/", "/pkg.Service/Method", "/caf%C3%A9"} {
		if n := testing.AllocsPerRun(100, func() { Clean(p) }); n != 0 {
			t.Errorf("Clean(%q): %v allocations, want 0", p, n)
		}
	}
}

func TestPrefix(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"/", ""},
		{"//", ""},
		{"/api", "/api"},
		{"/api/", "/api"},
		{"/api/v2/", "/api/v2"},
		{"/api/./v2", "/api/v2"},
		{"/x/../api", "/api"},
		{"/%61pi", "/api"},
		{"/pkg.Service/", "/pkg.Service"},
		{"/a%2Fb", "/a%2Fb"},
	} {
		got, err := Prefix(c.in)
		if err != nil || got != c.want {
			t.Errorf("Prefix(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"api", "/a b", "/a?b", "/a#b", "/100%", "/%zz", "/\x00", "/caf\xc3\xa9", "/" + strings.Repeat("a", MaxPrefixBytes)} {
		if got, err := Prefix(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Prefix(%q) = %q, %v; want an error wrapping ErrInvalid", bad, got, err)
		}
	}
}

func TestUnderAndStrip(t *testing.T) {
	for _, c := range []struct {
		p, prefix string
		under     bool
		stripped  string
	}{
		{"/api", "/api", true, "/"},
		{"/api/", "/api", true, "/"},
		{"/api/x", "/api", true, "/x"},
		{"/api/x/", "/api", true, "/x/"},
		{"/apix", "/api", false, ""},
		{"/api%2Fx", "/api", false, ""},
		{"/API", "/api", false, ""},
		{"/", "/api", false, ""},
		{"/anything", "", true, "/anything"},
		{"/", "", true, "/"},
	} {
		if got := Under(c.p, c.prefix); got != c.under {
			t.Errorf("Under(%q, %q) = %v, want %v", c.p, c.prefix, got, c.under)
		}
		if c.under {
			if got := Strip(c.p, c.prefix); got != c.stripped {
				t.Errorf("Strip(%q, %q) = %q, want %q", c.p, c.prefix, got, c.stripped)
			}
		}
	}
}

// decoded returns the segments of p, each percent-decoded leniently (a
// "%" that starts no escape is itself), as an app reads them.
func decoded(p string) []string {
	var segs []string
	for _, s := range strings.Split(p, "/")[1:] {
		var b []byte
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
				b = append(b, unhex(upper(s[i+1]))<<4|unhex(upper(s[i+2])))
				i += 2
				continue
			}
			b = append(b, s[i])
		}
		segs = append(segs, string(b))
	}
	return segs
}

// resolve is RFC 3986's remove_dot_segments on decoded segments, with
// empty segments dropped: the reference Clean is held to.
func resolve(segs []string) (out []string, trailing bool) {
	for _, s := range segs {
		switch s {
		case "", ".":
			trailing = true
		case "..":
			trailing = true
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			trailing = false
			out = append(out, s)
		}
	}
	return out, trailing && len(out) > 0
}

// FuzzClean holds Clean to its reference (decode each segment, resolve
// dot segments, drop empty ones), and checks that its result is clean,
// its own Clean, and that Under and Strip agree with it on segments.
func FuzzClean(f *testing.F) {
	for _, s := range []string{
		"/", "/api", "/api/", "//api", "/api/../admin", "/api%2Fx", "/API", "/api/%2e%2e/admin",
		"/api/..%2fadmin", "/%2e%2e/%2e%2e/etc", "/a/./b/../../c/", "/caf%c3%a9", "/100%", "/a\\..\\b",
		"/api?x=1", "/api#f", "/api/v2/", "/pkg.Service/Method", "/\x00/%00", "/%", "/%2", "/.%2e", "/%2e.",
	} {
		f.Add(s, "/api")
	}
	f.Fuzz(func(t *testing.T, p, q string) {
		c := Clean(p)
		if !strings.HasPrefix(c, "/") {
			t.Fatalf("Clean(%q) = %q: no leading /", p, c)
		}
		if !isClean(c) || Clean(c) != c {
			t.Fatalf("Clean(%q) = %q, whose Clean is %q", p, c, Clean(c))
		}
		if strings.Contains(c, "//") {
			t.Fatalf("Clean(%q) = %q: an empty segment", p, c)
		}
		if strings.HasPrefix(p, "/") {
			want, trailing := resolve(decoded(p))
			got := decoded(strings.TrimSuffix(c, "/"))
			if c == "/" {
				got = nil
			}
			if hasTrailing := c != "/" && strings.HasSuffix(c, "/"); !slices.Equal(got, want) || hasTrailing != trailing {
				t.Fatalf("Clean(%q) = %q: segments %q, want %q (trailing slash %v)", p, c, got, want, trailing)
			}
		}
		prefix, err := Prefix(q)
		if err != nil {
			return
		}
		if prefix != "" && (!strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") || Clean(prefix) != prefix) {
			t.Fatalf("Prefix(%q) = %q: not a clean prefix", q, prefix)
		}
		ps := decoded(prefix)
		cs := decoded(strings.TrimSuffix(c, "/"))
		under := len(ps) <= len(cs) && slices.Equal(ps, cs[:len(ps)])
		if c == "/" {
			under = prefix == ""
		}
		if Under(c, prefix) != under {
			t.Fatalf("Under(%q, %q) = %v; its segments say %v", c, prefix, !under, under)
		}
		if under {
			s := Strip(c, prefix)
			if prefix+s != c && !(s == "/" && c == prefix) {
				t.Fatalf("Strip(%q, %q) = %q", c, prefix, s)
			}
		}
	})
}
