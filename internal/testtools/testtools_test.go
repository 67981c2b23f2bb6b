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
