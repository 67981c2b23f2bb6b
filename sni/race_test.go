//go:build race

package sni

const raceEnabled = true
