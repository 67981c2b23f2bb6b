package examples_test

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHelpExitsZero runs tunnelkit, each of its subcommands and every other
// example binary with -h and -help: it prints its usage on stderr and exits
// 0.
func TestHelpExitsZero(t *testing.T) {
	bin := build(t, "tunnelkit", "demo", "hello", "sniproxy")
	for _, c := range []struct {
		name  string // the binary, and the subcommand
		usage string // how its usage starts
	}{
		{"tunnelkit", "Usage: tunnelkit SUBCOMMAND"},
		{"tunnelkit agent", "Usage of tunnelkit agent"},
		{"tunnelkit http", "Usage of tunnelkit agent"},
		{"tunnelkit edge", "Usage of tunnelkit edge"},
		{"demo", "Usage of demo"},
		{"hello", "Usage of hello"},
		{"sniproxy", "Usage of sniproxy"},
	} {
		for _, flag := range []string{"-h", "-help"} {
			t.Run(c.name+flag, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				words := strings.Fields(c.name)
				cmd := exec.CommandContext(ctx, filepath.Join(bin, words[0]), append(words[1:], flag)...)
				var stdout, stderr strings.Builder
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				var exit *exec.ExitError
				if err != nil && !errors.As(err, &exit) {
					t.Fatal(err)
				}
				if code := cmd.ProcessState.ExitCode(); code != 0 {
					t.Errorf("%s %s exited with %d, want 0\n%s", c.name, flag, code, stderr.String())
				}
				if !strings.Contains(stderr.String(), c.usage) {
					t.Errorf("%s %s: no %q on stderr:\n%s", c.name, flag, c.usage, stderr.String())
				}
				if stdout.Len() > 0 {
					t.Errorf("%s %s printed on stdout: %q", c.name, flag, stdout.String())
				}
			})
		}
	}
}
