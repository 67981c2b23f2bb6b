// Package testtools lets tests depend on outside commands: they skip where a
// command is missing, or fail in CI, where every tool must be installed
// (Need, Missing); Start runs one for the length of a test.
package testtools

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// RequireEnv is the environment variable that turns Need's skips into
// failures when set to 1 (CI sets it).
const RequireEnv = "TUNNELKIT_REQUIRE_TOOLS"

// Need skips the test when a command is missing, unless the environment
// variable TUNNELKIT_REQUIRE_TOOLS=1 (CI sets it), which makes it fail
// instead.
func Need(t testing.TB, commands ...string) {
	t.Helper()
	var missing []string
	for _, c := range commands {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return
	}
	Missing(t, "missing command(s) in $PATH: "+strings.Join(missing, ", "))
}

// Missing reports a missing prerequisite of a test other than a command (a
// system user, a network address), described by what: it skips the test,
// or fails it when TUNNELKIT_REQUIRE_TOOLS=1, as Need does.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatal(what + " (" + RequireEnv + "=1)")
	}
	t.Skip(what)
}
