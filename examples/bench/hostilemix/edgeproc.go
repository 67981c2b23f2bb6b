package main

// The edge under test: the example binary, built once and run as a child
// process per phase, whose memory, CPU and descriptors are read from /proc.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"
)

// childEnv, set to 1 in its environment, makes this program's binary run
// as the edge (edgecmd, the example edge's code) rather than as the
// benchmark: the benchmark starts its own executable as the edge child, so
// that nothing is compiled while it runs, and a test binary does the same.
const childEnv = "HOSTILEMIX_EDGE"

// runEdgeChild runs the example edge with the process's arguments and
// reports true when this process is an edge child (see childEnv); it does
// not return then.
func runEdgeChild() bool {
	if os.Getenv(childEnv) != "1" {
		return false
	}
	edgecmd.Main("edge", nil)
	os.Exit(0)
	return true
}

// edgeProc is a running edge.
type edgeProc struct {
	cmd       *exec.Cmd
	logPath   string
	agentAddr string
	httpAddr  string
	tlsAddr   string
	exited    chan struct{} // closed when the process ended
	waitErr   error         // its exit, once exited is closed

	stopSampling context.CancelFunc
	sampled      sync.WaitGroup
	mu           sync.Mutex
	peakRSS      int64 // KiB, the most VmRSS seen by the sampler
	peakFDs      int
}

// edgeStats is what a phase measured of the edge.
type edgeStats struct {
	HWM, RSS   int64 // KiB: VmHWM and VmRSS at the end of the phase
	PeakRSS    int64 // KiB: the highest VmRSS sampled every 100 ms
	PeakFDs    int   // the most open descriptors sampled
	CPU        time.Duration
	Shutdown   time.Duration // from SIGTERM to exit
	ExitErr    error         // how it exited, if not cleanly
	LogPath    string
	LogSummary []logCount
}

// startEdge runs exe on free loopback ports, writing its log to
// logDir/edge-<phase>.log, and returns once it listens.
func startEdge(ctx context.Context, exe, logDir, phase, tokens string) (*edgeProc, error) {
	ports, err := freePorts(3 + 4)
	if err != nil {
		return nil, err
	}
	e := &edgeProc{
		logPath:   filepath.Join(logDir, "edge-"+phase+".log"),
		agentAddr: loopback(ports[0]),
		httpAddr:  loopback(ports[1]),
		tlsAddr:   loopback(ports[2]),
		exited:    make(chan struct{}),
	}
	logFile, err := os.Create(e.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	e.cmd = exec.Command(exe,
		"-agents", e.agentAddr, "-http", e.httpAddr, "-tls", e.tlsAddr,
		"-tcp-ports", fmt.Sprintf("%d-%d", ports[3], ports[6]),
		"-domain", "example.test", "-tokens", tokens, "-proxy-protocol-from", "127.0.0.1/32")
	e.cmd.Env = append(os.Environ(), childEnv+"=1")
	e.cmd.Stdout, e.cmd.Stderr = logFile, logFile
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start edge: %w", err)
	}
	go func() {
		e.waitErr = e.cmd.Wait()
		close(e.exited)
	}()
	if err := e.waitUp(ctx, 15*time.Second); err != nil {
		e.cmd.Process.Kill()
		<-e.exited
		return nil, fmt.Errorf("%w\n%s", err, tail(e.logPath, 20))
	}
	sctx, cancel := context.WithCancel(context.Background())
	e.stopSampling = cancel
	e.sampled.Go(func() { e.sample(sctx) })
	return e, nil
}

// waitUp waits for the edge's "edge up" log line, written once it listens
// on every address.
func (e *edgeProc) waitUp(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if b, _ := os.ReadFile(e.logPath); bytes.Contains(b, []byte(`msg="edge up"`)) {
			return nil
		}
		select {
		case <-e.exited:
			return fmt.Errorf("the edge exited before it listened: %v", e.waitErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the edge did not listen within %v", timeout)
		}
	}
}

// sample keeps the highest VmRSS and descriptor count, every 100 ms.
func (e *edgeProc) sample(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		st, err := readStatus(e.cmd.Process.Pid)
		fds := countFDs(e.cmd.Process.Pid)
		if err == nil {
			e.mu.Lock()
			e.peakRSS = max(e.peakRSS, st["VmRSS"])
			e.peakFDs = max(e.peakFDs, fds)
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-e.exited:
			return
		case <-t.C:
		}
	}
}

// measure reads the edge's memory and CPU now, while it still runs.
func (e *edgeProc) measure() (edgeStats, error) {
	var s edgeStats
	st, err := readStatus(e.cmd.Process.Pid)
	if err != nil {
		return s, fmt.Errorf("edge status: %w (did it crash? see %s)", err, e.logPath)
	}
	s.HWM, s.RSS = st["VmHWM"], st["VmRSS"]
	s.CPU = cpuTime(e.cmd.Process.Pid)
	e.mu.Lock()
	s.PeakRSS, s.PeakFDs = max(e.peakRSS, s.RSS), e.peakFDs
	e.mu.Unlock()
	s.LogPath = e.logPath
	return s, nil
}

// stop asks the edge to shut down (SIGTERM), kills it after 15 s, and
// reports how long it took and how it exited.
func (e *edgeProc) stop() (time.Duration, error) {
	e.stopSampling()
	e.sampled.Wait()
	start := time.Now()
	select {
	case <-e.exited:
		return 0, fmt.Errorf("the edge had exited already: %v", e.waitErr)
	default:
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(15 * time.Second):
		e.cmd.Process.Kill()
		<-e.exited
		return time.Since(start), errors.New("the edge did not exit within 15 s of SIGTERM; killed")
	}
	return time.Since(start), e.waitErr
}

// readStatus returns the kB fields of /proc/pid/status.
func readStatus(pid int) (map[string]int64, error) {
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

// cpuTime returns the user and system time of process pid, or zero.
func cpuTime(pid int) time.Duration {
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

// countFDs returns how many descriptors process pid holds (0: unknown).
func countFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(ents)
}

// freePorts returns n consecutive loopback ports that are free now, below
// the kernel's ephemeral range so that no client conn takes one meanwhile.
func freePorts(n int) ([]int, error) {
	for range 100 {
		base := 10000 + rand.IntN(20000)
		var lns []net.Listener
		ok := true
		for p := base; p < base+n; p++ {
			ln, err := net.Listen("tcp", loopback(p))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if ok {
			ports := make([]int, n)
			for i := range ports {
				ports[i] = base + i
			}
			return ports, nil
		}
	}
	return nil, errors.New("no free loopback port range")
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logCount is how many lines of the edge's log had one key.
type logCount struct {
	Key string
	N   int
}

// summarizeLog counts the edge's log lines by level and message, and for
// HTTP errors by status and code, most frequent first.
func summarizeLog(path string, top int) ([]logCount, int) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	counts := map[string]int{}
	total := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		total++
		line := sc.Text()
		key := field(line, "level") + " " + field(line, "msg")
		if code := field(line, "code"); code != "" {
			key += " " + field(line, "status") + " " + code
		}
		counts[key]++
	}
	out := make([]logCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, logCount{k, n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > top {
		out = out[:top]
	}
	return out, total
}

// field returns the value of key in a slog text line, unquoted.
func field(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		if !strings.HasPrefix(line, key+"=") {
			return ""
		}
		i = -1
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if s, err := strconv.QuotedPrefix(v); err == nil {
			u, _ := strconv.Unquote(s)
			return u
		}
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}
