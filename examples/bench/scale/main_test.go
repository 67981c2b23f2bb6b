//go:build unix

package main

import (
	"strings"
	"testing"
)

// TestParseFlags: the run's flags, and each bad one refused with a clear
// error rather than a run that cannot complete.
func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-edges", "3", "-agents", "3000", "-check"})
	if err != nil {
		t.Fatal(err)
	}
	if c.edges != 3 || c.agents != 3000 || !c.check || c.baseline != 100 || !c.kill || !c.rolling {
		t.Errorf("parsed %+v", c)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-edges", "1"}, "-edges 1: a cluster has 2 at least"},
		{[]string{"-agents", "50"}, "want 1 <= baseline < agents"},
		{[]string{"-agents", "100"}, "want 1 <= baseline < agents"},
		{[]string{"-agents", "0", "-baseline", "0"}, "want 1 <= baseline < agents"},
		{[]string{"-rate", "0"}, "must be positive"},
		{[]string{"-per-process", "-5"}, "must be positive"},
		{[]string{"-idle", "0s"}, "-load and -idle must be positive"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-edges", "ten"}, "invalid value"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

// TestPercentile: nearest rank, on unsorted input, which it leaves as it
// was.
func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, tc := range []struct{ p, want float64 }{{50, 3}, {99, 5}, {100, 5}, {1, 1}, {20, 1}, {21, 2}} {
		if got := percentile(xs, tc.p); got != tc.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", xs, tc.p, got, tc.want)
		}
	}
	if xs[0] != 5 {
		t.Error("percentile sorted its input")
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile of none = %v, want 0", got)
	}
}
