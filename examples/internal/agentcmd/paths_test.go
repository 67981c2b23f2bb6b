package agentcmd

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPathSettings: a url with a path, its strip_prefix key and the
// -strip-prefix flag; a path on a tls or tcp url, and strip_prefix
// without a path, are refused where they are written; the same name under
// two paths are two endpoints, the same path spelled twice one.
func TestPathSettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yml string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	file := write("agent.yml", "endpoints:\n  - url: http://app\n    to: 3000\n  - url: http://app/api\n    to: 3001\n    strip_prefix: true\n  - url: http://app/API/\n    to: 3002\n")
	tcp := write("tcp.yml", "endpoints:\n  - url: tcp://:20001/api\n    to: 22\n")
	noPath := write("nopath.yml", "endpoints:\n  - url: http://app\n    to: 3000\n    strip_prefix: true\n")
	twice := write("twice.yml", "endpoints:\n  - url: http://app/api\n    to: 3000\n  - url: HTTP://App./api/\n    to: 3001\n")
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		args []string
		want string // each endpoint's URL and StripPrefix, or the error
	}{
		{[]string{"-config", file}, "[http://app:false http://app/api:true http://app/API/:false]"},
		{[]string{"-config", file, "-strip-prefix=false"}, "[http://app:false http://app/api:false http://app/API/:false]"},
		{[]string{"-url", "http://app/api", "-strip-prefix", "-to", "3000"}, "[http://app/api:true]"},
		{[]string{"-url", "https://app/api/v2/", "-to", "3000"}, "[https://app/api/v2/:false]"},
		{[]string{"-url", "tls://app.example.com/api", "-to", "3000"}, "-url tls://app.example.com/api: a path routes HTTP requests"},
		{[]string{"-strip-prefix", "http", "3000"}, "-strip-prefix: needs a url with a path"},
		{[]string{"-url", "http://app", "-strip-prefix", "-to", "3000"}, "-strip-prefix: needs a url with a path"},
		{[]string{"-config", tcp}, tcp + ":2: endpoint 1: url tcp://:20001/api: a path routes HTTP requests"},
		{[]string{"-config", noPath}, noPath + ":2: endpoint 1: strip_prefix: needs a url with a path"},
		{[]string{"-config", twice}, twice + ":4: endpoint 2: url HTTP://App./api/ is endpoint 1's already"},
	} {
		cl, err := parseArgs(tc.args, io.Discard, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		var got string
		_, specs, err := cl.load(noEnv)
		if err != nil {
			got = err.Error()
		} else {
			var v []string
			for _, s := range specs {
				v = append(v, fmt.Sprintf("%s:%v", s.URL, s.endpoint().StripPrefix))
			}
			got = fmt.Sprint(v)
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%q: %s; want %s", tc.args, got, tc.want)
		}
	}
}

func TestSameURLWithPaths(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"http://app/api", "HTTP://App./api/", true},
		{"app/api", "http://app:8080/api", true},
		{"http://app/api", "http://app/API", false},
		{"http://app/api", "http://app", false},
		{"http://app/", "http://app", true},
		{"http://app/x/../api", "http://app/api", true},
		{"https://app/api", "http://app/api", false},
	} {
		if got := sameURL(c.a, c.b); got != c.same {
			t.Errorf("sameURL(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
}
