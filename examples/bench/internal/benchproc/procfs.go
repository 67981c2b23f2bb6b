//go:build unix

package benchproc

// What the programs read of processes: this one's through getrusage,
// others' (and this one's syscalls) through Linux's /proc.

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SelfCPU returns this process's user and system time so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// CPUTime returns the user and system time of process pid so far, from
// /proc/PID/stat; zero where it cannot be read.
func CPUTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses: state is
	// the first, utime the 12th and stime the 13th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / 100 // USER_HZ is 100 on Linux
}

// Status returns the fields of /proc/PID/status counted in kB (VmRSS,
// VmHWM...), in KiB.
func Status(pid int) (map[string]int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		f := strings.Fields(v)
		if !ok || len(f) != 2 || f[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			m[k] = n
		}
	}
	return m, nil
}

// FDs returns how many descriptors process pid holds; 0: unknown.
func FDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(ents)
}

// IO is a process's read and write syscalls: what Linux counts as syscr
// and syscw (read, readv, write, writev and their kin, on sockets too).
// Negative: not known.
type IO struct{ Reads, Writes int64 }

// Since returns the syscalls from o to c; negative when either is not
// known.
func (c IO) Since(o IO) IO {
	if c.Reads < 0 || o.Reads < 0 {
		return IO{-1, -1}
	}
	return IO{c.Reads - o.Reads, c.Writes - o.Writes}
}

// SelfIO returns this process's syscalls so far, from /proc/self/io;
// {-1, -1} where it cannot be read.
func SelfIO() IO {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return IO{-1, -1}
	}
	c := IO{-1, -1}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscr":
			c.Reads = n
		case "syscw":
			c.Writes = n
		}
	}
	if c.Reads < 0 || c.Writes < 0 {
		return IO{-1, -1}
	}
	return c
}
