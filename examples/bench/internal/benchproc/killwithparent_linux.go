package benchproc

import (
	"os/exec"
	"syscall"
)

// KillWithParent has the kernel kill cmd's process when this process dies
// without stopping it (SIGKILL): for an outside tool (wrk, h2load), which,
// unlike a child of Start, does not watch its stdin. Call it before
// cmd.Start; it sets cmd.SysProcAttr.
func KillWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
