package agentcmd

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVerboseErrorsSetting: an endpoint's verbose_errors key, and the
// -verbose-errors flag, which wins over the key of every endpoint of a
// -config file; both are refused for a URL whose errors reach no page.
func TestVerboseErrorsSetting(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yml")
	if err := os.WriteFile(file, []byte("endpoints:\n  - url: http://a\n    to: 3000\n    verbose_errors: true\n  - url: https://b\n    to: 3001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tcp := filepath.Join(dir, "tcp.yml")
	if err := os.WriteFile(tcp, []byte("endpoints:\n  - url: tcp://\n    to: 22\n    verbose_errors: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		args []string
		want string // each endpoint's VerboseErrors, or the error
	}{
		{[]string{"-config", file}, "[true false]"},
		{[]string{"-config", file, "-verbose-errors"}, "[true true]"},
		{[]string{"-config", file, "-verbose-errors=false"}, "[false false]"},
		{[]string{"-verbose-errors", "http", "3000"}, "[true]"},
		{[]string{"http", "3000"}, "[false]"},
		{[]string{"-verbose-errors", "tcp", "22"}, "-verbose-errors: only for an http or https URL"},
		{[]string{"-config", tcp}, tcp + ":2: endpoint 1: verbose_errors: only for an http or https URL"},
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
			var v []bool
			for _, s := range specs {
				v = append(v, s.VerboseErrors)
			}
			got = fmt.Sprint(v)
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%q: %s; want %s", tc.args, got, tc.want)
		}
	}
}
