//go:build unix

package main

// The child's side of the processes: every process the program starts is
// this binary again, run as "datapath -role ROLE [-cpuprofile DIR]
// [-memprofile DIR] -- [the role's flags]". A server role
// sets itself up, prints one "ready key=value..." line on stdout, then
// answers the commands the parent writes to its stdin, one per line:
//
//	start NAME  count CPU time (and profile into NAME.*.pprof) from now; answers "ok"
//	stop        answers "cpu NANOSECONDS syscr N syscw N": the user+system time since start,
//	            and the read and write syscalls (Linux's /proc/self/io; -1 elsewhere)
//	mem         answers "mem heap=B stack=B goroutines=N" after two GCs
//
// When its stdin closes (the parent closed it, or the parent died), the
// child shuts down and exits: no child outlives the program.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// roles are the process roles, by name.
var roles = map[string]func(ctx context.Context, ctl *control, args []string) error{
	"edge":   runEdge,
	"agent":  runAgent,
	"agents": runAgents,
	"app":    runApp,
	"rproxy": runReverseProxy,
	"relay":  runRelay,
	"load":   runLoad,
}

// childMain runs the role named by args[0] with the rest of args, and
// returns the process's exit code.
func childMain(args []string) int {
	if len(args) == 0 || roles[args[0]] == nil {
		fmt.Fprintf(os.Stderr, "datapath: -role: want one of edge, agent, agents, app, rproxy, relay, load\n")
		return 2
	}
	role := roles[args[0]]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctl := &control{out: os.Stdout, done: cancel}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.StringVar(&ctl.cpuDir, "cpuprofile", "", "write a CPU profile per measurement into this directory")
	fs.StringVar(&ctl.memDir, "memprofile", "", "write allocation profiles per measurement into this directory")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if ctl.memDir != "" {
		// Fine enough for the heap profiles of idle sessions (a few KiB each).
		runtime.MemProfileRate = 4096
	}
	// Commands, and the end of stdin, arrive from the start: a role that
	// is still setting up when the parent goes away stops too.
	go ctl.serve(os.Stdin)
	if err := role(ctx, ctl, fs.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "datapath %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// control answers the parent's commands on a child's stdin and stdout.
type control struct {
	cpuDir, memDir string
	done           func() // called when stdin ends

	mu       sync.Mutex
	out      io.Writer
	readyNow chan struct{} // closed once the ready line is out
	once     sync.Once
	profile  *os.File      // the CPU profile being written; nil: none
	name     string        // the measurement's name, from start
	mems     int           // heap profiles written at mem commands
	cpu0     time.Duration // CPU time at start
	io0      ioCount       // syscalls at start
}

func (c *control) init() {
	c.once.Do(func() { c.readyNow = make(chan struct{}) })
}

// ready prints the ready line with fields ("key=value"), after which the
// parent sends commands.
func (c *control) ready(fields ...string) {
	c.init()
	c.println("ready " + strings.Join(fields, " "))
	close(c.readyNow)
}

// result prints a load's result line, for roles that do not take
// commands.
func (c *control) result(line string) { c.println("result " + line) }

func (c *control) println(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintln(c.out, s)
}

// serve reads commands from in until it ends, then calls c.done.
func (c *control) serve(in io.Reader) {
	c.init()
	defer c.done()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		<-c.readyNow // the parent waits for ready first; keep the order even if not
		cmd, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		var reply string
		var err error
		switch cmd {
		case "start":
			err = c.start(arg)
			reply = "ok"
		case "stop":
			var d time.Duration
			var io ioCount
			d, io, err = c.stop()
			reply = fmt.Sprintf("cpu %d syscr %d syscw %d", d, io.reads, io.writes)
		case "mem":
			m := readMem()
			reply = fmt.Sprintf("mem heap=%d stack=%d goroutines=%d", m.heap, m.stack, m.goroutines)
			if c.memDir != "" {
				// What holds the memory now (the idle row asks before
				// and after the sessions open: pprof -diff_base).
				c.mems++
				err = writeProfile("heap", filepath.Join(c.memDir, fmt.Sprintf("mem-%d-%d.heap.pprof", os.Getpid(), c.mems)))
			}
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		if err != nil {
			reply = "error " + err.Error()
		}
		c.println(reply)
	}
}

// start begins a measurement named name: CPU time counts from now, and
// the profiles asked for are started.
func (c *control) start(name string) error {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("start: bad name %q", name)
	}
	if c.profile != nil {
		return errors.New("start: a measurement is running")
	}
	c.name = name
	if c.memDir != "" {
		// The allocations so far, for go tool pprof -diff_base.
		if err := writeProfile("allocs", filepath.Join(c.memDir, name+".alloc-start.pprof")); err != nil {
			return err
		}
	}
	if c.cpuDir != "" {
		f, err := os.Create(filepath.Join(c.cpuDir, name+".cpu.pprof"))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		c.profile = f
	}
	c.cpu0 = cpuTime()
	c.io0 = readIOCount()
	return nil
}

// stop ends the measurement and returns the CPU time and the syscalls it
// took.
func (c *control) stop() (time.Duration, ioCount, error) {
	d := cpuTime() - c.cpu0
	io := readIOCount().since(c.io0)
	var err error
	if c.profile != nil {
		pprof.StopCPUProfile()
		err = c.profile.Close()
		c.profile = nil
	}
	if c.memDir != "" && c.name != "" {
		if werr := writeProfile("allocs", filepath.Join(c.memDir, c.name+".alloc.pprof")); err == nil {
			err = werr
		}
	}
	c.name = ""
	return d, io, err
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpuTime returns the user and system time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memStats is what the mem command reports.
type memStats struct {
	heap, stack int64 // bytes: live heap objects, goroutine stacks in use
	goroutines  int
}

// readMem collects garbage twice (the second frees what finalizers of the
// first released) and reads the live heap, the stacks and the goroutines.
func readMem() memStats {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return memStats{heap: int64(m.HeapAlloc), stack: int64(m.StackInuse), goroutines: runtime.NumGoroutine()}
}

// sub returns m - o.
func (m memStats) sub(o memStats) memStats {
	return memStats{heap: m.heap - o.heap, stack: m.stack - o.stack, goroutines: m.goroutines - o.goroutines}
}

// parseMem parses the fields of a "mem" reply or of ready fields with a
// prefix: heap=, stack=, goroutines=.
func parseMem(fields map[string]string, prefix string) (memStats, error) {
	var m memStats
	var err error
	get := func(k string) int64 {
		v, e := strconv.ParseInt(fields[prefix+k], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("field %s%s: %q", prefix, k, fields[prefix+k])
		}
		return v
	}
	m.heap, m.stack, m.goroutines = get("heap"), get("stack"), int(get("goroutines"))
	return m, err
}

// parseFields splits "k=v k=v" into a map.
func parseFields(s string) map[string]string {
	m := map[string]string{}
	for f := range strings.FieldsSeq(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}
