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

// TestHelpExitsZero runs every example binary with -h and -help: it prints
// its usage and exits 0.
func TestHelpExitsZero(t *testing.T) {
	names := []string{"agent", "demo", "edge", "hello", "sniproxy"}
	bin := build(t, names...)
	for _, name := range names {
		for _, flag := range []string{"-h", "-help"} {
			t.Run(name+flag, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, filepath.Join(bin, name), flag)
				var stdout, stderr strings.Builder
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				var exit *exec.ExitError
				if err != nil && !errors.As(err, &exit) {
					t.Fatal(err)
				}
				if code := cmd.ProcessState.ExitCode(); code != 0 {
					t.Errorf("%s %s exited with %d, want 0\n%s", name, flag, code, stderr.String())
				}
				if want := "Usage of " + name; !strings.Contains(stderr.String(), want) {
					t.Errorf("%s %s: no %q on stderr:\n%s", name, flag, want, stderr.String())
				}
				if stdout.Len() > 0 {
					t.Errorf("%s %s printed on stdout: %q", name, flag, stdout.String())
				}
			})
		}
	}
}
