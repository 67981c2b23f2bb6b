//go:build !race

package edge_test

// raceEnabled is true when the tests are built with -race: the scale tests
// that need no race detector skip (.ci/run runs them without it).
const raceEnabled = false
