//go:build unix && !linux

package main

import "os/exec"

// killWithParent does nothing here: only Linux has a parent-death signal.
func killWithParent(*exec.Cmd) {}
