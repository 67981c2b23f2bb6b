//go:build unix && !linux

package benchproc

import "os/exec"

// KillWithParent does nothing here: only Linux has a parent-death signal.
func KillWithParent(*exec.Cmd) {}
