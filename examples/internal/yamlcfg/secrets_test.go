//go:build unix

package yamlcfg

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
)

// secretConfig has a secret field, as the agent's token.
type secretConfig struct {
	Edge     string         `yaml:"edge"`
	Token    string         `yaml:"token" secret:"a token"`
	Proxy    string         `yaml:"proxy" secret:"a proxy password,url"`
	Policies []policyHolder `yaml:"endpoints"`
}

type policyHolder struct {
	Policy any `yaml:"policy"`
}

// loadFile writes src to a file of mode perm and loads it: the settings,
// then each endpoint's policy.
func loadFile(t *testing.T, src string, perm os.FileMode, vars map[string]string) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path, env(vars))
	if err != nil {
		return err
	}
	var c secretConfig
	if err := f.Decode(f.Root, "", &c); err != nil {
		return err
	}
	for i := 0; i+1 < len(f.Root.Content); i += 2 {
		if f.Root.Content[i].Value != "endpoints" {
			continue
		}
		for _, e := range f.Root.Content[i+1].Content {
			if _, err := f.Policy(e.Content[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// A file that writes a secret out is refused when group or others may
// read or write it, naming the file, the line, and what to do; a secret
// from ${VAR} is not in the file, and leaves it free to be read.
func TestSecretsWrittenOut(t *testing.T) {
	vars := map[string]string{"T": "s3cret", "PW": "pw", "CRED": "ann:pw"}
	for _, c := range []struct {
		src     string
		line    int
		what    string // "": taken
		private bool   // taken at 0600 and refused at 0644
	}{
		{"edge: a:1\ntoken: s3cret\n", 2, "a token", true},
		{"edge: a:1\ntoken: ${T}\n", 0, "", false},
		{"edge: a:1\ntoken: \"\"\n", 0, "", false},
		{"token: pre-${T}\n", 1, "a token", true},
		{"endpoints:\n  - policy:\n      basic_auth: [\"ann:${PW}\", \"${CRED}\"]\n", 0, "", false},
		{"endpoints:\n  - policy:\n      basic_auth: [\"ann:pw\"]\n", 3, "a basic_auth password", true},
		{"endpoints:\n  - policy:\n      basic_auth:\n        credentials:\n          - ann:${PW}\n          - bob:pw\n", 6, "a basic_auth password", true},
		{"endpoints:\n  - policy:\n      webhook: {provider: github, secret: whsec}\n", 3, "a webhook secret", true},
		{"endpoints:\n  - policy:\n      webhook:\n        provider: github\n        secret: ${T}\n", 0, "", false},
		{"endpoints:\n  - policy:\n      oidc:\n        issuer: https://id.example.com\n        client_id: app\n        client_secret: shh\n        allow_domains: [example.com]\n", 6, "an oidc client_secret", true},
		{"endpoints:\n  - policy:\n      cidr_allow: [10.0.0.0/8]\n", 0, "", false},
		{"edge: a:1\nproxy: http://ann:pw@proxy:3128\n", 2, "a proxy password", true},
		{"proxy: socks5://ann:p@ss@proxy:1080/\n", 1, "a proxy password", true},
		{"proxy: ann:pw@proxy:3128\n", 1, "a proxy password", true},
		{"proxy: http://ann:${PW}x@proxy:3128\n", 1, "a proxy password", true},
		{"proxy: http://ann:${PW}@proxy:3128\n", 0, "", false},
		{"proxy: ${T}\n", 0, "", false},
		{"proxy: http://ann@proxy:3128\n", 0, "", false},
		{"proxy: http://ann:@proxy:3128\n", 0, "", false},
		{"proxy: http://proxy:3128/a:b@c\n", 0, "", false},
		{"proxy: proxy:3128\n", 0, "", false},
	} {
		if err := loadFile(t, c.src, 0o600, vars); err != nil {
			t.Errorf("%q at 0600: %v", c.src, err)
		}
		for _, perm := range []os.FileMode{0o644, 0o640, 0o660, 0o604} {
			err := loadFile(t, c.src, perm, vars)
			switch {
			case !c.private && err != nil:
				t.Errorf("%q at %04o: %v, want it taken", c.src, perm, err)
			case c.private && (!errors.Is(err, safefile.ErrOpenToOthers) ||
				!strings.Contains(err.Error(), "agent.yml is open to others (mode 0") ||
				!strings.HasSuffix(err.Error(), "): its line "+strconv.Itoa(c.line)+" writes out "+c.what+" (${VAR} would take it from the environment); chmod 600 it")):
				t.Errorf("%q at %04o: %v, want it refused for %s at line %d", c.src, perm, err, c.what, c.line)
			}
		}
	}
}

// A named pipe given as the file is refused without blocking.
func TestLoadNamedPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yml")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Load(path, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, safefile.ErrNotRegular) || !strings.HasPrefix(err.Error(), path) {
			t.Errorf("Load of a named pipe: %v, want ErrNotRegular naming it", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Load of a named pipe blocked")
	}
}
