//go:build unix

package benchproc

// The child's side of the commands (see the package doc).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Control is a child's side of its parent's commands: its ready line, and
// the measurements the parent starts and stops. Main makes it.
type Control struct {
	// CPUDir is where each measurement's CPU profile goes, as
	// NAME.cpu.pprof (NAME from the start command); empty: none
	// (Options.CPUProfile).
	CPUDir string
	// MemDir is where each measurement's allocation profiles go, as
	// NAME.alloc-start.pprof and NAME.alloc.pprof, and the heap at each
	// mem command, as mem-PID-N.heap.pprof; empty: none
	// (Options.MemProfile).
	MemDir string

	done func() // called when stdin ends

	mu       sync.Mutex
	out      io.Writer
	readyNow chan struct{} // closed once the ready line is out
	once     sync.Once
	profile  *os.File      // the CPU profile being written; nil: none
	name     string        // the measurement's name, from start
	mems     int           // heap profiles written at mem commands
	cpu0     time.Duration // CPU time at start
	io0      IO            // syscalls at start
}

func (c *Control) init() {
	c.once.Do(func() { c.readyNow = make(chan struct{}) })
}

// Ready prints the ready line with fields ("key=value", which the parent
// finds in Proc.Fields), after which the parent sends commands.
func (c *Control) Ready(fields ...string) {
	c.init()
	c.println(strings.TrimSpace("ready " + strings.Join(fields, " ")))
	close(c.readyNow)
}

// Result prints a result line, "result " and line, for a role that takes
// no commands: the parent reads it with Proc.Next.
func (c *Control) Result(line string) { c.println("result " + line) }

func (c *Control) println(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintln(c.out, s)
}

// serve reads commands from in until it ends, then calls c.done.
func (c *Control) serve(in io.Reader) {
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
			var io IO
			d, io, err = c.stop()
			reply = fmt.Sprintf("cpu %d syscr %d syscw %d", d, io.Reads, io.Writes)
		case "mem":
			m := ReadMem()
			reply = fmt.Sprintf("mem heap=%d stack=%d goroutines=%d", m.Heap, m.Stack, m.Goroutines)
			if c.MemDir != "" {
				// What holds the memory now (the datapath's idle row
				// asks before and after the sessions open: pprof
				// -diff_base).
				c.mems++
				err = WriteProfile("heap", filepath.Join(c.MemDir, fmt.Sprintf("mem-%d-%d.heap.pprof", os.Getpid(), c.mems)))
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
func (c *Control) start(name string) error {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("start: bad name %q", name)
	}
	if c.profile != nil {
		return errors.New("start: a measurement is running")
	}
	c.name = name
	if c.MemDir != "" {
		// The allocations so far, for go tool pprof -diff_base.
		if err := WriteProfile("allocs", filepath.Join(c.MemDir, name+".alloc-start.pprof")); err != nil {
			return err
		}
	}
	if c.CPUDir != "" {
		f, err := os.Create(filepath.Join(c.CPUDir, name+".cpu.pprof"))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		c.profile = f
	}
	c.cpu0 = SelfCPU()
	c.io0 = SelfIO()
	return nil
}

// stop ends the measurement and returns the CPU time and the syscalls it
// took.
func (c *Control) stop() (time.Duration, IO, error) {
	d := SelfCPU() - c.cpu0
	io := SelfIO().Since(c.io0)
	var err error
	if c.profile != nil {
		pprof.StopCPUProfile()
		err = c.profile.Close()
		c.profile = nil
	}
	if c.MemDir != "" && c.name != "" {
		if werr := WriteProfile("allocs", filepath.Join(c.MemDir, c.name+".alloc.pprof")); err == nil {
			err = werr
		}
	}
	c.name = ""
	return d, io, err
}

// WriteProfile writes the runtime profile named name (heap, allocs...) to
// a new file at path.
func WriteProfile(name, path string) error {
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

// Mem is what the mem command reports of a process.
type Mem struct {
	Heap, Stack int64 // bytes: live heap objects, goroutine stacks in use
	Goroutines  int
}

// ReadMem collects garbage twice (the second frees what finalizers of the
// first released) and reads this process's live heap, stacks and
// goroutines.
func ReadMem() Mem {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return Mem{Heap: int64(m.HeapAlloc), Stack: int64(m.StackInuse), Goroutines: runtime.NumGoroutine()}
}

// Sub returns m - o.
func (m Mem) Sub(o Mem) Mem {
	return Mem{Heap: m.Heap - o.Heap, Stack: m.Stack - o.Stack, Goroutines: m.Goroutines - o.Goroutines}
}

// ParseMem parses the fields heap=, stack= and goroutines=, each after
// prefix, of a mem answer or a ready line.
func ParseMem(fields map[string]string, prefix string) (Mem, error) {
	var m Mem
	var err error
	get := func(k string) int64 {
		v, e := strconv.ParseInt(fields[prefix+k], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("field %s%s: %q", prefix, k, fields[prefix+k])
		}
		return v
	}
	m.Heap, m.Stack, m.Goroutines = get("heap"), get("stack"), int(get("goroutines"))
	return m, err
}

// parseFields splits "k=v k=v" into a map; words without "=" are left
// out.
func parseFields(s string) map[string]string {
	m := map[string]string{}
	for f := range strings.FieldsSeq(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}
