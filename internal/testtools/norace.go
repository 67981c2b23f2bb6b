//go:build !race

package testtools

// RaceEnabled reports whether the tests are built with -race (see race.go).
const RaceEnabled = false
