//go:build !race

package sni

const raceEnabled = false
