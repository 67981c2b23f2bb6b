//go:build unix

package main

// The parent's side of the processes (see control.go for the child's).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a process of the run: this binary in a role.
type child struct {
	name   string            // how tables and profiles call it: edge, agent, relay1...
	fields map[string]string // of its ready line
	log    *logSink          // its stderr

	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string   // its stdout, line by line; closed at its end
	exited  chan struct{} // closed once it exited and waitErr is set
	waitErr error
	once    sync.Once
	killed  bool
}

// readyTimeout bounds a server role's setup: processes starting, an agent
// connecting and binding, sessions opening.
const readyTimeout = 60 * time.Second

// spawn starts this binary as role, named name, with args; a server role
// (timeout > 0) is returned once it printed its ready line, within
// timeout. Its stderr goes to a log file of the run. It gets a process
// group of its own, so that a Ctrl-C reaches the parent alone, which then
// shuts every child down in order; a child whose parent dies sees its
// stdin end and exits.
func (e *env) spawn(ctx context.Context, name, role string, timeout time.Duration, args ...string) (*child, error) {
	e.mu.Lock()
	e.seq++
	seq := e.seq
	e.mu.Unlock()
	c := &child{
		name:   name,
		lines:  make(chan string, 64),
		exited: make(chan struct{}),
	}
	var err error
	c.log, err = newLogSink(filepath.Join(e.logDir, fmt.Sprintf("%03d-%s-%s.log", seq, e.caseName, name)))
	if err != nil {
		return nil, err
	}
	full := []string{"-role", role}
	if e.cfg.CPUProfile != "" && role != "load" {
		full = append(full, "-cpuprofile", e.cfg.CPUProfile)
	}
	if e.cfg.MemProfile != "" && role != "load" {
		full = append(full, "-memprofile", e.cfg.MemProfile)
	}
	full = append(full, "--") // the role's own flags follow
	c.cmd = exec.Command(e.exe, append(full, args...)...)
	c.cmd.Stderr = c.log // a pipe: the child writes its log as to journald
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if e.cfg.GOMAXPROCS > 0 && role != "load" {
		c.cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(e.cfg.GOMAXPROCS))
	}
	c.stdin, err = c.cmd.StdinPipe()
	var stdout io.ReadCloser
	if err == nil {
		stdout, err = c.cmd.StdoutPipe()
	}
	if err == nil {
		err = c.cmd.Start()
	}
	if err != nil {
		c.log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	e.track(c)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default: // nobody asked: a child says nothing unasked
			}
		}
		close(c.lines)
		c.waitErr = c.cmd.Wait() // after the whole log was copied
		c.log.Close()
		close(c.exited)
	}()
	e.logf("started %s (pid %d): %s", name, c.cmd.Process.Pid, strings.Join(c.cmd.Args[1:], " "))
	if timeout <= 0 {
		return c, nil
	}
	line, err := c.next(ctx, timeout)
	if err == nil && !strings.HasPrefix(line, "ready") {
		err = fmt.Errorf("said %q, want ready", line)
	}
	if err != nil {
		c.close()
		return nil, c.failure("start", err)
	}
	c.fields = parseFields(strings.TrimPrefix(line, "ready"))
	return c, nil
}

// next returns the child's next stdout line.
func (c *child) next(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-c.lines:
		if ok {
			return line, nil
		}
		<-c.exited
		return "", fmt.Errorf("exited: %v", c.waitErr)
	case <-t.C:
		return "", fmt.Errorf("no answer within %v", timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// call sends a command and returns its answer.
func (c *child) call(ctx context.Context, cmd string) (string, error) {
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		return "", c.failure(cmd, err)
	}
	line, err := c.next(ctx, 2*time.Minute)
	if err == nil && strings.HasPrefix(line, "error ") {
		err = errors.New(strings.TrimPrefix(line, "error "))
	}
	if err != nil {
		return "", c.failure(cmd, err)
	}
	return line, nil
}

// start begins a measurement named name in the child.
func (c *child) start(ctx context.Context, name string) error {
	_, err := c.call(ctx, "start "+name+"."+c.name)
	return err
}

// stop ends the measurement and returns the CPU time and the syscalls the
// child used.
func (c *child) stop(ctx context.Context) (time.Duration, ioCount, error) {
	line, err := c.call(ctx, "stop")
	if err != nil {
		return 0, ioCount{}, err
	}
	d, io, err := parseStop(line)
	if err != nil {
		return 0, ioCount{}, c.failure("stop", err)
	}
	return d, io, nil
}

// parseStop parses a stop command's answer.
func parseStop(line string) (time.Duration, ioCount, error) {
	f := strings.Fields(line)
	if len(f) != 6 || f[0] != "cpu" || f[2] != "syscr" || f[4] != "syscw" {
		return 0, ioCount{}, fmt.Errorf("answer %q", line)
	}
	var v [3]int64
	for i, s := range []string{f[1], f[3], f[5]} {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, ioCount{}, fmt.Errorf("answer %q: %w", line, err)
		}
		v[i] = n
	}
	return time.Duration(v[0]), ioCount{reads: v[1], writes: v[2]}, nil
}

// mem returns the child's live heap, stacks and goroutines.
func (c *child) mem(ctx context.Context) (memStats, error) {
	line, err := c.call(ctx, "mem")
	if err != nil {
		return memStats{}, err
	}
	return parseMem(parseFields(strings.TrimPrefix(line, "mem")), "")
}

// close ends the child: its stdin closes, which it takes as the order to
// shut down cleanly; past 20 s its process group is killed. It returns how
// the child exited, unless it exited cleanly.
func (c *child) close() error {
	c.once.Do(func() {
		c.stdin.Close()
		t := time.NewTimer(20 * time.Second)
		defer t.Stop()
		select {
		case <-c.exited:
		case <-t.C:
			c.killed = true
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
	})
	if c.killed {
		return c.failure("shutdown", errors.New("did not exit within 20 s of its stdin's end: killed"))
	}
	if c.waitErr != nil {
		return c.failure("exit", c.waitErr)
	}
	return nil
}

// cpu returns the CPU time the child used over its life, once it exited.
func (c *child) cpu() time.Duration {
	st := c.cmd.ProcessState
	if st == nil {
		return 0
	}
	return st.UserTime() + st.SystemTime()
}

// failure wraps err with the child's name and the end of its log.
func (c *child) failure(what string, err error) error {
	return fmt.Errorf("%s: %s: %w\n%s", c.name, what, err, indent(c.log.tail(15)))
}

// runLoad runs a Go load generator with args, named name in the tables,
// and returns its result with its CPU time.
func (e *env) runLoad(ctx context.Context, name string, args ...string) (loadResult, error) {
	c, err := e.spawn(ctx, name, "load", 0, args...)
	if err != nil {
		return loadResult{}, err
	}
	line, err := c.next(ctx, 10*time.Minute)
	if cerr := c.close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return loadResult{}, c.failure("load", err)
	}
	var res loadResult
	if !strings.HasPrefix(line, "result ") {
		return res, c.failure("load", fmt.Errorf("said %q, want a result", line))
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "result ")), &res); err != nil {
		return res, c.failure("load", err)
	}
	res.Tool, res.CPU = "load", c.cpu()
	return res, nil
}

func indent(s string) string {
	if s == "" {
		return "    (empty log)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// logSink keeps a child's log in a file: its first logHead bytes, then,
// when the child goes on (an access line per request adds up to hundreds
// of megabytes in a long run), its last logTail bytes and how much was
// left out between them.
type logSink struct {
	mu      sync.Mutex
	f       *os.File
	head    int64  // bytes written to f
	tailBuf []byte // the last bytes past the head, at most logTail
	skipped int64  // bytes past the head no longer in tailBuf
	closed  bool
}

const (
	logHead = 1 << 20
	logTail = 64 << 10
)

func newLogSink(path string) (*logSink, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &logSink{f: f}, nil
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	if l.closed {
		return n, nil
	}
	if k := min(int64(len(p)), logHead-l.head); k > 0 {
		l.f.Write(p[:k])
		l.head += k
		p = p[k:]
	}
	l.tailBuf = append(l.tailBuf, p...)
	if over := len(l.tailBuf) - logTail; over > 0 {
		l.skipped += int64(over)
		l.tailBuf = append(l.tailBuf[:0], l.tailBuf[over:]...)
	}
	return n, nil
}

// Close writes the tail to the file and closes it.
func (l *logSink) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.skipped > 0 {
		fmt.Fprintf(l.f, "\n[... %d bytes of log left out ...]\n", l.skipped)
	}
	l.f.Write(l.tailBuf)
	return l.f.Close()
}

// tail returns the last n lines logged.
func (l *logSink) tail(n int) string {
	l.mu.Lock()
	b := l.tailBuf
	if len(b) == 0 || l.closed {
		b, _ = os.ReadFile(l.f.Name())
	}
	s := string(b)
	l.mu.Unlock()
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ioCount is a process's read and write syscalls: what Linux counts as
// syscr and syscw (read, readv, write, writev and their kin, on sockets
// too). Negative: not known.
type ioCount struct{ reads, writes int64 }

// since returns the syscalls from o to c.
func (c ioCount) since(o ioCount) ioCount {
	if c.reads < 0 || o.reads < 0 {
		return ioCount{-1, -1}
	}
	return ioCount{c.reads - o.reads, c.writes - o.writes}
}

// readIOCount returns this process's syscalls so far, from /proc/self/io.
func readIOCount() ioCount {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return ioCount{-1, -1}
	}
	c := ioCount{-1, -1}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscr":
			c.reads = n
		case "syscw":
			c.writes = n
		}
	}
	if c.reads < 0 || c.writes < 0 {
		return ioCount{-1, -1}
	}
	return c
}
