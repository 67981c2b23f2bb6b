//go:build unix

// Package benchproc runs the processes of the benchmark programs
// (examples/bench/datapath and examples/bench/hostilemix): each part they
// measure runs in a process of its own, so that none shares a Go runtime
// with another and each one's CPU time, memory and profile are its own.
// Every such process is the program's own binary started again in a role:
// nothing is compiled while the program measures, and a test binary
// serves as its own children.
//
// The parent starts a child with Start; the program's main, and its
// TestMain, call Main first, which in a child runs the role and exits,
// and in the program itself returns at once. A role that serves prints
// one "ready key=value..." line on stdout once it is set up
// (Control.Ready), which Start waits for, then answers the parent's
// commands on its stdin, one per line:
//
//	start NAME  count CPU time (and profile into the Options' directories) from now; answers "ok"
//	stop        answers "cpu NANOSECONDS syscr N syscw N": the user+system time since start,
//	            and the read and write syscalls (Linux's /proc/self/io; -1 elsewhere)
//	mem         answers "mem heap=B stack=B goroutines=N" after two GCs
//
// A role ends when its stdin ends (Proc.Close, or the parent died) or on
// SIGTERM (Proc.Terminate): no child outlives the program. Each child has
// a process group of its own, so that a Ctrl-C reaches the parent alone,
// which then shuts its children down in order.
//
// Typical use, in the program:
//
//	func main() {
//		benchproc.Main("datapath", roles) // returns only in the program itself
//		...
//		edge, err := benchproc.Start(ctx, benchproc.Options{
//			Name: "edge", Role: "edge", Args: args,
//			LogPath: filepath.Join(dir, "edge.log"), ReadyTimeout: time.Minute,
//		})
//		...
//		defer edge.Close()
//		agents := edge.Fields["agents"] // from its ready line
//	}
//
// The package also has what both programs read of processes (Status,
// CPUTime, FDs, SelfIO...) and FreePorts.
package benchproc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// roleEnv names the variable of a child's environment that carries its
// role: the role's arguments stay its own, with no flag of the harness's
// among them but the profile directories, before "--".
const roleEnv = "TUNNELKIT_BENCH_ROLE"

// A Role is what a child runs, with the arguments Options.Args gave it.
// A role that serves calls ctl.Ready once it is set up and returns once
// ctx is done (the parent ended the child); one that computes a result
// calls ctl.Result and returns. A non-nil error ends the process with
// status 1, the error on stderr (the child's log).
type Role func(ctx context.Context, ctl *Control, args []string) error

// Main runs the role this process was started in by Start, if it was,
// and exits: with status 0 once the role returned nil, 1 after an error,
// 2 for a role that roles lacks or a bad flag. In the program itself,
// which no role was given to, it returns at once. program names the
// program in errors.
//
// The role is taken out of the process's environment before it runs, so
// that what the role starts in turn runs as itself.
func Main(program string, roles map[string]Role) {
	name, ok := os.LookupEnv(roleEnv)
	if !ok {
		return
	}
	os.Unsetenv(roleEnv)
	os.Exit(runRole(program, name, roles, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// runRole runs the role name with args, reading commands from stdin and
// answering on stdout, and returns the process's exit status.
func runRole(program, name string, roles map[string]Role, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	role := roles[name]
	if role == nil {
		fmt.Fprintf(stderr, "%s: role %q: want one of %s\n", program, name, strings.Join(slices.Sorted(maps.Keys(roles)), ", "))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctl := &Control{out: stdout, done: cancel}
	fs := flag.NewFlagSet(program+" "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&ctl.CPUDir, "cpuprofile", "", "write a CPU profile per measurement into this directory")
	fs.StringVar(&ctl.MemDir, "memprofile", "", "write allocation profiles per measurement into this directory")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if ctl.MemDir != "" {
		// Fine enough for the heap profiles of idle sessions (a few KiB each).
		runtime.MemProfileRate = 4096
	}
	// Commands, and the end of stdin, arrive from the start: a role that
	// is still setting up when the parent goes away stops too.
	go ctl.serve(stdin)
	if err := role(ctx, ctl, fs.Args()); err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", program, name, err)
		return 1
	}
	return 0
}

// ErrExited is the error of Proc.Terminate for a child that had exited
// before it was asked to.
var ErrExited = errors.New("exited already")
