package agentcmd

import (
	"strings"
	"testing"
)

// What people type for -to reads as they mean it; anything else says what
// is wrong and what is wanted.
func TestParseTarget(t *testing.T) {
	for in, want := range map[string]target{
		"3000":                   {network: "tcp", addr: "127.0.0.1:3000"},
		":3000":                  {network: "tcp", addr: "127.0.0.1:3000"},
		"localhost:3000":         {network: "tcp", addr: "localhost:3000"},
		"[::1]:3000":             {network: "tcp", addr: "[::1]:3000"},
		"http://127.0.0.1:3000":  {network: "tcp", addr: "127.0.0.1:3000"},
		"http://app.internal":    {network: "tcp", addr: "app.internal:80"},
		"https://127.0.0.1:8443": {network: "tcp", addr: "127.0.0.1:8443", tls: true},
		"HTTPS://dev.local/":     {network: "tcp", addr: "dev.local:443", tls: true},
		"unix:/run/app.sock":     {network: "unix", addr: "/run/app.sock"},
		"unix:///run/app.sock":   {network: "unix", addr: "/run/app.sock"},
	} {
		got, err := parseTarget(in)
		if err != nil || got != want {
			t.Errorf("parseTarget(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"":                       "empty",
		"localhost":              "no port",
		"70000":                  "a port is a number from 1 to 65535",
		"a:b:c":                  "not host:port",
		"host:http":              `port "http" is not a number`,
		"ftp://x:21":             `scheme "ftp"`,
		"http://x:1/api":         "no path",
		"http://user@x:1":        "no path, query or user",
		"unix:run/app.sock":      "absolute",
		"https://":               "no host",
		"http://127.0.0.1:99999": `port "99999"`,
	} {
		_, err := parseTarget(in)
		if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "want a port (3000), host:port") {
			t.Errorf("parseTarget(%q): %v; want an error saying %q and what is wanted", in, err, why)
		}
	}
}

func TestHostHeader(t *testing.T) {
	tcp := target{network: "tcp", addr: "127.0.0.1:3000"}
	unix := target{network: "unix", addr: "/run/app.sock"}
	for _, c := range []struct {
		t          target
		rule, want string
	}{
		{tcp, "", ""}, {tcp, "rewrite", "127.0.0.1:3000"}, {tcp, "app.local", "app.local"}, {unix, "rewrite", "localhost"},
	} {
		if got := c.t.hostHeader(c.rule); got != c.want {
			t.Errorf("%v.hostHeader(%q) = %q, want %q", c.t, c.rule, got, c.want)
		}
	}
}

// FuzzParseTarget: whatever is typed, parseTarget answers a target it
// can print and read back as the same, or an error saying what is
// wanted; it never panics.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"3000", ":3000", "localhost:3000", "[::1]:3000", "https://127.0.0.1:8443", "http://x", "unix:/run/a.sock", "unix:", "https://[::1", "http://%zz", "0", "65536"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := parseTarget(s)
		if err != nil {
			if !strings.Contains(err.Error(), "want a port (3000)") {
				t.Fatalf("parseTarget(%q): %v, which does not say what is wanted", s, err)
			}
			return
		}
		if tg.addr == "" {
			t.Fatalf("parseTarget(%q) = %+v: no address", s, tg)
		}
		again, err := parseTarget(tg.String())
		if err != nil || again != tg {
			t.Fatalf("parseTarget(%q) = %+v, whose String %q reads as %+v, %v", s, tg, tg.String(), again, err)
		}
	})
}
