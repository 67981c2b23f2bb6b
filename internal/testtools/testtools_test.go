package testtools_test

import (
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

func TestNeed(t *testing.T) {
	testtools.Need(t, "go")
	t.Setenv(testtools.RequireEnv, "")
	var skipped bool
	t.Run("missing", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		testtools.Need(t, "go", "tunnelkit-no-such-command")
		t.Error("Need did not skip for a missing command")
	})
	if !skipped {
		t.Error("the subtest was not skipped")
	}
}

func TestStart(t *testing.T) {
	testtools.Need(t, "sh")
	p := testtools.Start(t, t.TempDir(), "sh", "-c", "echo one; echo ready; exec sleep 60")
	if err := p.WaitOutput(t.Context(), "ready"); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	p.Stop() // again: no-op
	if got := p.Output(); got != "one\nready\n" {
		t.Errorf("Output = %q", got)
	}

	// A command that exits before printing what is awaited.
	q := testtools.Start(t, "", "sh", "-c", "echo bye")
	if err := q.WaitOutput(t.Context(), "ready"); err == nil {
		t.Error("WaitOutput succeeded for a command that exited")
	}
}
