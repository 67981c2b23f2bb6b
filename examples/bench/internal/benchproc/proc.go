//go:build unix

package benchproc

// The parent's side of a child.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options says how Start runs a child.
type Options struct {
	// Name is how errors call the child (edge, agent, relay1...). Empty:
	// its Role.
	Name string
	// Exe is the binary to run, whose main calls Main first. Empty: this
	// process's own executable.
	Exe string
	// Role is the role the child runs: a key of the roles its Main has.
	// Required.
	Role string
	// Args are the role's arguments.
	Args []string
	// Env is added to the child's environment, which is this process's
	// with GORACE's atexit_sleep_ms=0 (unless GORACE sets it): a binary
	// built with -race otherwise sleeps a second at every exit, and a run
	// ends tens of children. Nil: nothing more.
	Env []string
	// LogPath is the file the child's stderr goes to, created anew.
	// Required.
	LogPath string
	// Nice, when positive, runs the child at that niceness (nice(1)), so
	// that it takes the CPU the others leave: a child that stands for
	// machines elsewhere. Zero: this process's.
	Nice int
	// LogHead, when positive, bounds the log for a child that logs a line
	// per request: its stderr then goes through this process, which
	// writes its first LogHead bytes to LogPath and, once it exited, its
	// last 64 KiB and how many bytes went between them. Zero: the child
	// writes its whole log to the file itself.
	LogHead int64
	// CPUProfile and MemProfile are directories for the child's profiles
	// per measurement (Control.CPUDir and MemDir). Empty: none.
	CPUProfile, MemProfile string
	// ReadyTimeout, when positive, has Start wait that long at most for
	// the child's ready line; its fields are then in Proc.Fields. Zero:
	// Start returns once the process started (a child that prints a
	// result instead: read it with Proc.Next).
	ReadyTimeout time.Duration
	// CloseGrace is how long Close waits for the child to exit once its
	// stdin ended, before it kills the child's process group. Zero: 20 s.
	CloseGrace time.Duration
}

// logTail is how much of a bounded log's end is kept (Options.LogHead).
const logTail = 64 << 10

// Proc is a running child, or one that ran.
type Proc struct {
	// Name is how errors call it (Options.Name).
	Name string
	// Fields are the "key=value" fields of its ready line, nil without
	// one (Options.ReadyTimeout).
	Fields map[string]string

	grace   time.Duration
	logPath string
	sink    *logSink // the bounded log; nil: the child writes the file

	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string   // its stdout, line by line; closed at its end
	readErr error         // why reading lines stopped, once lines is closed; nil: stdout ended
	exited  chan struct{} // closed once it exited and waitErr is set
	waitErr error

	closeOnce sync.Once
	killed    bool // by Close, past CloseGrace
}

// Start runs a child in the role o says, in a process group of its own,
// and returns it once it started or, with o.ReadyTimeout, once it printed
// its ready line. A child that fails to get ready is closed, and the
// error ends with the last lines of its log. ctx bounds the wait for the
// ready line, not the child's life: Close or Terminate end it.
func Start(ctx context.Context, o Options) (*Proc, error) {
	if o.Role == "" || o.LogPath == "" {
		return nil, errors.New("benchproc: Options.Role and LogPath are required")
	}
	exe := o.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("benchproc: %w", err)
		}
	}
	p := &Proc{
		Name:    o.Name,
		grace:   o.CloseGrace,
		logPath: o.LogPath,
		lines:   make(chan string, 64),
		exited:  make(chan struct{}),
	}
	if p.Name == "" {
		p.Name = o.Role
	}
	if p.grace <= 0 {
		p.grace = 20 * time.Second
	}
	var args []string
	if o.CPUProfile != "" {
		args = append(args, "-cpuprofile", o.CPUProfile)
	}
	if o.MemProfile != "" {
		args = append(args, "-memprofile", o.MemProfile)
	}
	args = append(append(args, "--"), o.Args...) // the role's own arguments follow
	p.cmd = exec.Command(exe, args...)
	if o.Nice > 0 {
		p.cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(o.Nice), exe}, args...)...)
	}
	p.cmd.Env = append(append(os.Environ(), roleEnv+"="+o.Role, gorace(os.Getenv("GORACE"))), o.Env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	logFile, err := os.Create(o.LogPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	if o.LogHead > 0 {
		p.sink = &logSink{f: logFile, headMax: o.LogHead}
		p.cmd.Stderr = p.sink // a pipe: the child writes its log as to journald
	} else {
		p.cmd.Stderr = logFile
		defer logFile.Close() // the child holds its own descriptor
	}
	p.stdin, err = p.cmd.StdinPipe()
	var stdout io.ReadCloser
	if err == nil {
		stdout, err = p.cmd.StdoutPipe()
	}
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		if p.sink != nil {
			p.sink.Close()
		}
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	go p.read(stdout)
	if o.ReadyTimeout <= 0 {
		return p, nil
	}
	line, err := p.Next(ctx, o.ReadyTimeout)
	if err == nil && line != "ready" && !strings.HasPrefix(line, "ready ") {
		err = fmt.Errorf("said %q, want ready", line)
	}
	if err != nil {
		p.Close()
		return nil, p.Failure("start", err)
	}
	p.Fields = parseFields(strings.TrimPrefix(line, "ready"))
	return p, nil
}

// gorace returns GORACE's setting for a child: v, with atexit_sleep_ms=0
// unless v sets it.
func gorace(v string) string {
	if !strings.Contains(v, "atexit_sleep_ms") {
		v = strings.TrimSpace(v + " atexit_sleep_ms=0")
	}
	return "GORACE=" + v
}

// read passes the child's stdout to p.lines until it ends, then waits
// for the child.
func (p *Proc) read(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		select {
		case p.lines <- sc.Text():
		default: // nobody asked: a child says nothing unasked
		}
	}
	p.readErr = sc.Err()
	close(p.lines)
	io.Copy(io.Discard, stdout) // after a line too long: the child must not block on its stdout
	p.waitErr = p.cmd.Wait()    // after the whole log was copied
	if p.sink != nil {
		p.sink.Close()
	}
	close(p.exited)
}

// Pid returns the child's process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited returns a channel closed once the child exited; Err then says
// how.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err returns how the child exited, once Exited is closed: nil when it
// exited with status 0.
func (p *Proc) Err() error {
	select {
	case <-p.exited:
		return p.waitErr
	default:
		return errors.New("still running")
	}
}

// Next returns the child's next stdout line, waiting timeout at most.
func (p *Proc) Next(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-p.lines:
		if ok {
			return line, nil
		}
		if p.readErr != nil {
			return "", fmt.Errorf("stdout: %w", p.readErr)
		}
	case <-t.C:
		return "", fmt.Errorf("no answer within %v", timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
	// Its stdout ended: it exits, or has.
	select {
	case <-p.exited:
		return "", fmt.Errorf("exited: %v", p.waitErr)
	case <-t.C:
		return "", fmt.Errorf("its stdout ended, and it did not exit within %v", timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Call sends the command cmd and returns its answer; an answer "error
// ..." is returned as an error.
func (p *Proc) Call(ctx context.Context, cmd string) (string, error) {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return "", p.Failure(cmd, err)
	}
	line, err := p.Next(ctx, 2*time.Minute)
	if err == nil && strings.HasPrefix(line, "error ") {
		err = errors.New(strings.TrimPrefix(line, "error "))
	}
	if err != nil {
		return "", p.Failure(cmd, err)
	}
	return line, nil
}

// StartMeasure has the child count its CPU time and syscalls from now,
// and write its profiles named name.
func (p *Proc) StartMeasure(ctx context.Context, name string) error {
	_, err := p.Call(ctx, "start "+name)
	return err
}

// StopMeasure ends the measurement and returns the CPU time and the
// syscalls the child used since StartMeasure.
func (p *Proc) StopMeasure(ctx context.Context) (time.Duration, IO, error) {
	line, err := p.Call(ctx, "stop")
	if err != nil {
		return 0, IO{}, err
	}
	d, io, err := parseStop(line)
	if err != nil {
		return 0, IO{}, p.Failure("stop", err)
	}
	return d, io, nil
}

// parseStop parses a stop command's answer.
func parseStop(line string) (time.Duration, IO, error) {
	f := strings.Fields(line)
	if len(f) != 6 || f[0] != "cpu" || f[2] != "syscr" || f[4] != "syscw" {
		return 0, IO{}, fmt.Errorf("answer %q", line)
	}
	var v [3]int64
	for i, s := range []string{f[1], f[3], f[5]} {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, IO{}, fmt.Errorf("answer %q: %w", line, err)
		}
		v[i] = n
	}
	return time.Duration(v[0]), IO{Reads: v[1], Writes: v[2]}, nil
}

// Mem returns the child's live heap, stacks and goroutines.
func (p *Proc) Mem(ctx context.Context) (Mem, error) {
	line, err := p.Call(ctx, "mem")
	if err != nil {
		return Mem{}, err
	}
	return ParseMem(parseFields(strings.TrimPrefix(line, "mem")), "")
}

// Close ends the child: its stdin ends, which its role takes as the order
// to shut down cleanly; past Options.CloseGrace its process group is
// killed. It returns how the child exited, unless it exited cleanly; a
// second call returns the same.
func (p *Proc) Close() error {
	p.closeOnce.Do(func() {
		p.stdin.Close()
		t := time.NewTimer(p.grace)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			p.killed = true
			syscall.Kill(-p.Pid(), syscall.SIGKILL)
			<-p.exited
		}
	})
	if p.killed {
		return p.Failure("shutdown", fmt.Errorf("did not exit within %v of its stdin's end: killed", p.grace))
	}
	if p.waitErr != nil {
		return p.Failure("exit", p.waitErr)
	}
	return nil
}

// Terminate ends the child with SIGTERM, kills its process group past
// grace, and returns how long it took to exit and how it exited: nil when
// it exited cleanly. A child that had exited before returns an error
// wrapping ErrExited.
func (p *Proc) Terminate(grace time.Duration) (time.Duration, error) {
	select {
	case <-p.exited:
		p.Close()
		return 0, fmt.Errorf("%s %w: %v", p.Name, ErrExited, p.waitErr)
	default:
	}
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.exited
		p.Close()
		return time.Since(start), fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.Name, grace)
	}
	took := time.Since(start)
	p.Close()
	return took, p.waitErr
}

// CPU returns the user and system time the child used over its life, once
// it exited; zero before.
func (p *Proc) CPU() time.Duration {
	select {
	case <-p.exited:
	default:
		return 0
	}
	st := p.cmd.ProcessState
	return st.UserTime() + st.SystemTime()
}

// Failure wraps err with the child's name and what it was doing, and adds
// the last lines of its log.
func (p *Proc) Failure(what string, err error) error {
	return fmt.Errorf("%s: %s: %w\n%s", p.Name, what, err, indent(p.Tail(15)))
}

// Tail returns the last n lines of the child's log.
func (p *Proc) Tail(n int) string {
	if p.sink != nil {
		return lastLines(p.sink.tail(), n)
	}
	b, _ := os.ReadFile(p.logPath)
	return lastLines(string(b), n)
}

// LogPath returns the file of the child's log (Options.LogPath).
func (p *Proc) LogPath() string { return p.logPath }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func indent(s string) string {
	if s == "" {
		return "    (empty log)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
