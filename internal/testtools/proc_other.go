//go:build !linux

package testtools

import "os/exec"

// killWithParent does nothing outside Linux: a process outlives a test
// binary that dies without running its cleanups.
func killWithParent(*exec.Cmd) {}
