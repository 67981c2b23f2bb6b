package main

// The edge under test: this program's binary started again as the edge
// (benchproc), a fresh one per phase, whose memory, CPU and descriptors
// are read from /proc.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
	"github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"
)

// roles are the processes this program's binary runs as, started again by
// itself (benchproc): the edge.
var roles = map[string]benchproc.Role{"edge": runEdge}

// runEdge runs the example edge command (internal/edgecmd, the code of
// "tunnelkit edge" less its etcd and metrics flags) with args, its log and
// what it prints on stderr, until the parent ends it (SIGTERM); it is
// ready once the edge listens on every address ("edge up").
func runEdge(ctx context.Context, ctl *benchproc.Control, args []string) error {
	logw, up := benchproc.WatchFor(os.Stderr, `msg="edge up"`)
	done := make(chan error, 1)
	go func() { done <- edgecmd.Run(ctx, "edge", args, os.Stderr, logw, nil) }()
	select {
	case <-up:
		ctl.Ready()
		return <-done
	case err := <-done:
		if err == nil {
			err = errors.New("the edge stopped before it listened")
		}
		return err
	}
}

// edgeProc is a running edge.
type edgeProc struct {
	p         *benchproc.Proc
	logPath   string
	agentAddr string
	httpAddr  string
	tlsAddr   string

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

// startEdge runs exe as the edge on free loopback ports, writing its log
// to logDir/edge-<phase>.log, and returns once it listens.
func startEdge(ctx context.Context, exe, logDir, phase, tokens string) (*edgeProc, error) {
	ports, err := benchproc.FreePorts(3 + 4)
	if err != nil {
		return nil, err
	}
	e := &edgeProc{
		logPath:   filepath.Join(logDir, "edge-"+phase+".log"),
		agentAddr: benchproc.Loopback(ports[0]),
		httpAddr:  benchproc.Loopback(ports[1]),
		tlsAddr:   benchproc.Loopback(ports[2]),
	}
	e.p, err = benchproc.Start(ctx, benchproc.Options{
		Name: "edge", Exe: exe, Role: "edge",
		Args: []string{
			"-agents", e.agentAddr, "-http", e.httpAddr, "-tls", e.tlsAddr,
			"-tcp-ports", fmt.Sprintf("%d-%d", ports[3], ports[6]),
			"-domain", "example.test", "-tokens", tokens, "-proxy-protocol-from", "127.0.0.1/32",
		},
		LogPath:      e.logPath,
		ReadyTimeout: 15 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	e.stopSampling = cancel
	e.sampled.Go(func() { e.sample(sctx) })
	return e, nil
}

// sample keeps the highest VmRSS and descriptor count, every 100 ms.
func (e *edgeProc) sample(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		st, err := benchproc.Status(e.p.Pid())
		fds := benchproc.FDs(e.p.Pid())
		if err == nil {
			e.mu.Lock()
			e.peakRSS = max(e.peakRSS, st["VmRSS"])
			e.peakFDs = max(e.peakFDs, fds)
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-e.p.Exited():
			return
		case <-t.C:
		}
	}
}

// measure reads the edge's memory and CPU now, while it still runs.
func (e *edgeProc) measure() (edgeStats, error) {
	var s edgeStats
	st, err := benchproc.Status(e.p.Pid())
	if err != nil {
		return s, fmt.Errorf("edge status: %w (did it crash? see %s)", err, e.logPath)
	}
	s.HWM, s.RSS = st["VmHWM"], st["VmRSS"]
	s.CPU = benchproc.CPUTime(e.p.Pid())
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
	return e.p.Terminate(15 * time.Second)
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
