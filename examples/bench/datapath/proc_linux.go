package main

import (
	"os/exec"
	"syscall"
)

// killWithParent has the kernel kill an outside tool (wrk, h2load) when
// this process dies without stopping it (SIGKILL): the tool, unlike the
// children that are this binary, does not watch its stdin.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
