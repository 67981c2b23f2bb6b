//go:build race

package testtools

// RaceEnabled reports whether the tests are built with -race. Tests whose
// cost the race detector multiplies for nothing (one goroutine's parsing,
// scale tests) then run a sample or skip, and .ci/run runs them whole
// without it.
const RaceEnabled = true
