package testtools

import (
	"os/exec"
	"syscall"
)

// killWithParent has the kernel kill the process when the test binary dies
// without running its cleanups (a test timeout's panic, a signal).
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
