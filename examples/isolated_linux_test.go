package examples_test

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"unsafe"
)

// isolatedEnv marks the test binary re-executed by isolatedCommand, as the
// first process of namespaces of its own.
const isolatedEnv = "TUNNELKIT_TEST_ISOLATED"

// isolatedCommand returns a command that runs name with args in a network
// namespace of its own, whose only interface is loopback (127.0.0.1 and
// ::1), and a PID namespace of its own: the ports a README block names are
// free whatever else runs on the machine, no packet leaves it, and when
// the command exits the kernel kills every process it left behind. Without
// root, a user namespace maps the caller to root in it.
func isolatedCommand(name string, args ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	if uid := os.Getuid(); uid != 0 {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	cmd.SysProcAttr = attr
	return cmd, nil
}

// isolatedChild returns at once, unless this process is the test binary
// that isolatedCommand started: then it brings loopback up and executes
// the command of its arguments in its place, or exits 125.
func isolatedChild() {
	if os.Getenv(isolatedEnv) != "1" {
		return
	}
	os.Unsetenv(isolatedEnv)
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "isolated:", err)
		os.Exit(125)
	}
	if len(os.Args) < 2 {
		fail(fmt.Errorf("no command"))
	}
	if err := loopbackUp(); err != nil {
		fail(fmt.Errorf("bringing loopback up: %w", err))
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		fail(err)
	}
	fail(syscall.Exec(path, os.Args[1:], os.Environ()))
}

// loopbackUp sets the flag IFF_UP on the interface lo, as `ip link set lo
// up` does: a new network namespace has it down.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	var req struct { // struct ifreq, with ifr_flags
		name  [syscall.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], "lo")
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&req))); e != 0 {
		return e
	}
	req.flags |= syscall.IFF_UP
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&req))); e != 0 {
		return e
	}
	return nil
}
