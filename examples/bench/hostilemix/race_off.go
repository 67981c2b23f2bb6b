//go:build !race

package main

// raceEnabled is true when built with -race: the attacks are scaled down.
const raceEnabled = false
