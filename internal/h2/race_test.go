//go:build race

package h2

// raceEnabled reports whether the race detector is on: single-goroutine
// parser tests then run a sample, or skip their heaviest case, whose cost
// the detector multiplies for nothing; .ci/run runs them whole without it.
const raceEnabled = true
