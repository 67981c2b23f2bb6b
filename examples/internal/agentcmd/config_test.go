package agentcmd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
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

// TestHealthCheckSetting: an endpoint's health_check key and the
// -health-check and -health-interval flags make the agent's check; a
// check that cannot be is refused at load, naming the key.
func TestHealthCheckSetting(t *testing.T) {
	dir := t.TempDir()
	noEnv := func(string) (string, bool) { return "", false }
	load := func(args ...string) ([]endpointSpec, error) {
		cl, err := parseArgs(args, io.Discard, io.Discard)
		if err != nil {
			return nil, err
		}
		_, specs, err := cl.load(noEnv)
		return specs, err
	}
	file := func(check string) string {
		path := filepath.Join(dir, "agent.yml")
		if err := os.WriteFile(path, []byte("endpoints:\n  - url: http://a\n    to: 3000\n    health_check:\n"+check), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	specs, err := load("-config", file("      path: /healthz\n      interval: 5s\n      timeout: 1s\n      unhealthy_after: 4\n      healthy_after: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if hc := specs[0].health; hc == nil || hc.Interval.String() != "5s" || hc.Timeout.String() != "1s" || hc.UnhealthyAfter != 4 || hc.HealthyAfter != 1 || hc.Check == nil {
		t.Errorf("the check made of the file: %+v", hc)
	}
	if specs, err := load("-health-check", "tcp", "-health-interval", "3s", "tcp", "22"); err != nil || specs[0].health == nil || specs[0].health.Interval.String() != "3s" {
		t.Errorf("-health-check tcp -health-interval 3s: %v, %v", specs, err)
	}
	for _, tc := range []struct{ check, want string }{
		{"      pth: /healthz\n", `unknown key "pth" in endpoints[0].health_check: did you mean "path"?`},
		{"      path: healthz\n", `health_check.path "healthz": want a path that starts with /`},
		{"      path: /h\n      interval: 500ms\n", "health_check.interval 500ms: want 1s at least"},
		{"      path: /h\n      interval: 2s\n      timeout: 2s\n", "health_check.timeout 2s: want less than the interval, 2s"},
		{"      path: /h\n      unhealthy_after: 0\n", "health_check.unhealthy_after 0: want 1 at least"},
		{"      path: /h\n      healthy_after: -1\n", "health_check.healthy_after -1: want 1 at least"},
		{"      path: /h\n      tcp: true\n", "health_check: path or tcp, not both"},
		{"      interval: 5s\n", "health_check: want path (an HTTP GET of it) or tcp: true"},
		{"      path: /h\n      interval: often\n", `health_check.interval "often": want a duration`},
		{"      path: /h\n      healthy_after: lots\n", `healthy_after takes a whole number, not "lots"`},
	} {
		_, err := load("-config", file(tc.check))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %s", tc.check, err, tc.want)
		}
	}
	if _, err := load("-health-interval", "5s", "http", "3000"); err == nil || !strings.Contains(err.Error(), "-health-interval: with -health-check") {
		t.Errorf("-health-interval alone: %v", err)
	}
}

// TestProxyPasswordIsASecret: a -config file whose proxy URL writes a
// password out is refused while others may read it, as one that writes
// the token out; a proxy without a password, or whose password comes from
// ${VAR}, leaves the file free to be read.
func TestProxyPasswordIsASecret(t *testing.T) {
	env := func(k string) (string, bool) {
		v, ok := map[string]string{"PW": "s3cret", "PROXY": "http://ann:s3cret@proxy:3128"}[k]
		return v, ok
	}
	for _, tc := range []struct {
		proxy  string
		secret bool
	}{
		{"http://ann:s3cret@proxy:3128", true},
		{"socks5://ann:s3cret@proxy:1080", true},
		{"ann:s3cret@proxy:3128", true},
		{"http://ann:${PW}@proxy:3128", false},
		{"${PROXY}", false},
		{"http://ann@proxy:3128", false},
		{"http://proxy:3128", false},
	} {
		path := filepath.Join(t.TempDir(), "agent.yml")
		if err := os.WriteFile(path, []byte("edge: 127.0.0.1:1\nproxy: "+tc.proxy+"\nendpoints:\n  - url: http://app\n    to: 3000\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, perm := range []os.FileMode{0o600, 0o644} {
			if err := os.Chmod(path, perm); err != nil {
				t.Fatal(err)
			}
			cl, err := parseArgs([]string{"-config", path}, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = cl.load(env)
			switch refused := tc.secret && perm != 0o600; {
			case refused && (!errors.Is(err, safefile.ErrOpenToOthers) || !strings.Contains(err.Error(), "its line 2 writes out a proxy password")):
				t.Errorf("proxy %s in a file of mode %04o: %v; want it refused for writing out a proxy password", tc.proxy, perm, err)
			case !refused && err != nil:
				t.Errorf("proxy %s in a file of mode %04o: %v; want it taken", tc.proxy, perm, err)
			}
		}
	}
}

// TestHeartbeatSetting: the heartbeat_interval key and the
// -heartbeat-interval flag, which wins over it, set the client's
// HeartbeatInterval; a bad one is refused.
func TestHeartbeatSetting(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yml")
	if err := os.WriteFile(file, []byte("heartbeat_interval: 45s\nendpoints:\n  - url: http://a\n    to: 3000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(bad, []byte("heartbeat_interval: often\nendpoints:\n  - url: http://a\n    to: 3000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		args []string
		want string // the interval, or the error
	}{
		{[]string{"http", "3000"}, "0s"},
		{[]string{"-heartbeat-interval", "10s", "http", "3000"}, "10s"},
		{[]string{"-config", file}, "45s"},
		{[]string{"-config", file, "-heartbeat-interval", "20s"}, "20s"},
		{[]string{"-heartbeat-interval", "-1s", "http", "3000"}, "-heartbeat-interval -1s: want a duration"},
		{[]string{"-config", bad}, bad + ": heartbeat_interval \"often\": want a duration"},
	} {
		cl, err := parseArgs(tc.args, io.Discard, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		var got string
		g, _, err := cl.load(noEnv)
		if err != nil {
			got = err.Error()
		} else {
			got = g.heartbeat.String()
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%q: %s; want %s", tc.args, got, tc.want)
		}
	}
}
