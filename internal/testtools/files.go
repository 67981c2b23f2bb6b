package testtools

import (
	"os"
	"path/filepath"
	"testing"
)

// LinkTarget makes a file for a test to plant a link to, where a program
// should not write through one; untouched fails the test unless the file
// still holds its own bytes.
func LinkTarget(t testing.TB) (path string, untouched func()) {
	t.Helper()
	const own = "the victim's own bytes\n"
	path = filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(path, []byte(own), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, func() {
		t.Helper()
		if b, err := os.ReadFile(path); err != nil || string(b) != own {
			t.Errorf("the planted link's target changed: %q, %v", b, err)
		}
	}
}
