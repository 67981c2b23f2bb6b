package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// result is what a run measured.
type result struct {
	Phases []*phase
}

// failures returns the well-behaved client's failures over every phase.
func (r *result) failures() int {
	n := 0
	for _, p := range r.Phases {
		n += p.Good.NFailed
	}
	return n
}

// phase is what one phase measured.
type phase struct {
	Name       string
	Good       goodResult
	Edge       edgeStats
	LogLines   int
	Attacks    []*attack
	Drops      int64    // agent sessions that ended
	DropWhy    []string // why, the first few
	SelfCPU    time.Duration
	MachineCPU float64 // the busy share of every CPU of the machine, 0 to 1
	SelfFDs    int     // the most descriptors this process held, sampled
	AttackStop time.Duration
}

// run builds the edge, runs the quiet phase and the hostile one, and
// prints the report to out.
func run(ctx context.Context, cfg *config, out io.Writer) (*result, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "hostilemix-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	logDir := cfg.LogDir
	keepLogs := logDir != ""
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "hostilemix-logs-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	tokens := filepath.Join(tmp, "tokens.txt")
	if err := os.WriteFile(tokens, []byte("alice-token alice\nbob-token bob\n"), 0o600); err != nil {
		return nil, err
	}

	res := &result{}
	for _, hostile := range []bool{false, true} {
		name := map[bool]string{false: "quiet", true: "hostile"}[hostile]
		p, err := runPhase(ctx, cfg, exe, logDir, tokens, name, hostile)
		if err != nil {
			return nil, fmt.Errorf("%s phase: %w (edge logs in %s)", name, err, logDir)
		}
		res.Phases = append(res.Phases, p)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	if res.failures() > 0 {
		keepLogs = true
	}
	report(out, cfg, res, logDir, keepLogs)
	if !keepLogs {
		os.RemoveAll(logDir)
	}
	return res, nil
}

// runPhase runs a fresh edge and backend, the attacks when hostile, and
// the well-behaved client for cfg.Duration.
func runPhase(ctx context.Context, cfg *config, exe, logDir, tokens, name string, hostile bool) (*phase, error) {
	p := &phase{Name: name}
	e, err := startEdge(ctx, exe, logDir, name, tokens)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			e.stop()
		}
	}()
	cfg.logf("%s: edge pid %d up (agents %s, http %s), log %s", name, e.p.Pid(), e.agentAddr, e.httpAddr, e.logPath)
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	b, err := startBackend(sctx, e.agentAddr)
	if err == nil {
		err = waitServed(sctx, e.httpAddr)
		if err != nil {
			b.close()
		}
	}
	cancel()
	if err != nil {
		return nil, err
	}
	cfg.logf("%s: app served at http://%s, tcp endpoint %s", name, appHost, b.tcpAddr)

	fdCtx, stopFDs := context.WithCancel(ctx)
	defer stopFDs()
	fdDone := make(chan int, 1)
	go func() { fdDone <- samplePeakFDs(fdCtx) }()
	cpu0 := benchproc.SelfCPU()
	busy0, total0 := machineCPU()

	var attacks []*attack
	waitAttacks := func() {}
	actx, stopAttacks := context.WithCancel(ctx)
	defer stopAttacks()
	if hostile {
		tg := &target{cfg: cfg, agentAddr: e.agentAddr, httpAddr: e.httpAddr, tcpAddr: b.tcpAddr}
		attacks, waitAttacks = startAttacks(actx, tg)
		cfg.logf("%s: attacks started; the client starts in %v", name, cfg.Ramp)
		sleep(ctx, cfg.Ramp)
	}

	cfg.logf("%s: well-behaved client for %v", name, cfg.Duration)
	p.Good = runGood(ctx, cfg, e.httpAddr, b.tcpAddr)
	cfg.logf("%s: client done: %d HTTP, %d TCP, %d failures", name, p.Good.HTTP.N, p.Good.TCP.N, p.Good.NFailed)

	// The edge's memory while the attacks still run.
	p.Edge, err = e.measure()
	for _, a := range attacks {
		a.held = a.t.open.Load()
	}
	stopAttacks()
	t0 := time.Now()
	attacksDone := make(chan struct{})
	go func() { waitAttacks(); close(attacksDone) }()
	select {
	case <-attacksDone:
	case <-time.After(30 * time.Second):
		return nil, errors.New("the attacks did not stop within 30 s")
	}
	p.AttackStop = time.Since(t0)
	p.Attacks = attacks
	p.SelfCPU = benchproc.SelfCPU() - cpu0
	if busy1, total1 := machineCPU(); total1 > total0 {
		p.MachineCPU = float64(busy1-busy0) / float64(total1-total0)
	}
	stopFDs()
	p.SelfFDs = <-fdDone
	p.Drops, p.DropWhy = b.drops.Load(), b.dropReasons()
	b.close()
	if err != nil {
		return nil, err
	}
	cfg.logf("%s: stopping the edge", name)
	stopped = true
	p.Edge.Shutdown, p.Edge.ExitErr = e.stop()
	p.Edge.LogSummary, p.LogLines = summarizeLog(e.logPath, 8)
	return p, nil
}

// buildState describes the commit and the changes of the working tree
// this binary, and so the edge child, was built from, as the go command
// stamped them.
func buildState() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "no build information"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "no VCS information (built with -buildvcs=false or outside a git work tree)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		return "revision " + rev + " with uncommitted changes"
	}
	return "revision " + rev
}

// machineCPU returns the busy and total jiffies of every CPU so far, from
// /proc/stat.
func machineCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy, total
}

// samplePeakFDs returns the most descriptors this process held, sampled
// every 250 ms until ctx is done.
func samplePeakFDs(ctx context.Context) int {
	peak := 0
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		peak = max(peak, benchproc.FDs(os.Getpid()))
		select {
		case <-ctx.Done():
			return peak
		case <-t.C:
		}
	}
}

// report prints the table.
func report(w io.Writer, cfg *config, r *result, logDir string, keptLogs bool) {
	q, h := r.Phases[0], r.Phases[1]
	fmt.Fprintf(w, "hostilemix: the example edge of this binary (%s), %v per phase\n", buildState(), cfg.Duration)
	pace := "back to back"
	if cfg.Pace > 0 {
		pace = "one every " + cfg.Pace.String()
	}
	fmt.Fprintf(w, "well-behaved client: %d keep-alive HTTP workers (%s) + a TCP echo every 200 ms, from %s\n\n", cfg.Workers, pace, goodAddr)
	row := func(label string, f func(p *phase) string) {
		fmt.Fprintf(w, "%-34s %18s %18s\n", label, f(q), f(h))
	}
	row("", func(p *phase) string { return p.Name })
	row("good HTTP requests ok", func(p *phase) string { return fmt.Sprint(p.Good.HTTP.N) })
	row("good TCP echoes ok", func(p *phase) string { return fmt.Sprint(p.Good.TCP.N) })
	row("good client failures", func(p *phase) string { return fmt.Sprint(p.Good.NFailed) })
	row("HTTP p50 / p99", func(p *phase) string { return ms(p.Good.HTTP.P50) + " / " + ms(p.Good.HTTP.P99) })
	row("HTTP max", func(p *phase) string { return ms(p.Good.HTTP.Max) })
	row("TCP p50 / p99", func(p *phase) string { return ms(p.Good.TCP.P50) + " / " + ms(p.Good.TCP.P99) })
	row("TCP max", func(p *phase) string { return ms(p.Good.TCP.Max) })
	row("edge peak RSS (VmHWM)", func(p *phase) string { return mib(p.Edge.HWM) })
	row("edge peak VmRSS sampled / at end", func(p *phase) string { return mib(p.Edge.PeakRSS) + " / " + mib(p.Edge.RSS) })
	row("edge CPU time", func(p *phase) string { return p.Edge.CPU.Round(10 * time.Millisecond).String() })
	row("edge peak descriptors", func(p *phase) string { return fmt.Sprint(p.Edge.PeakFDs) })
	row("edge shutdown (SIGTERM to exit)", func(p *phase) string { return p.Edge.Shutdown.Round(time.Millisecond).String() })
	row("this process: CPU / peak fds", func(p *phase) string {
		return fmt.Sprintf("%v / %d", p.SelfCPU.Round(10*time.Millisecond), p.SelfFDs)
	})
	row("machine CPU busy (all tenants)", func(p *phase) string {
		return fmt.Sprintf("%.0f%% of %d CPUs", 100*p.MachineCPU, runtime.NumCPU())
	})
	row("agent session drops", func(p *phase) string { return fmt.Sprint(p.Drops) })
	fmt.Fprintf(w, "\nhostile/quiet: HTTP p50 x%.2f, p99 x%.2f; TCP p50 x%.2f, p99 x%.2f; edge VmHWM x%.2f\n",
		ratio(h.Good.HTTP.P50, q.Good.HTTP.P50), ratio(h.Good.HTTP.P99, q.Good.HTTP.P99),
		ratio(h.Good.TCP.P50, q.Good.TCP.P50), ratio(h.Good.TCP.P99, q.Good.TCP.P99),
		float64(h.Edge.HWM)/float64(max(q.Edge.HWM, 1)))

	for _, p := range r.Phases {
		if p.Good.NFailed > 0 {
			fmt.Fprintf(w, "\ngood client failures, %s phase: %s\n", p.Name, strings.Join(p.Good.Failures, "; "))
			fmt.Fprintf(w, "  first: %s\n", strings.Join(p.Good.First, "\n         "))
		}
		fmt.Fprintf(w, "\nslowest, %s phase: %s\n", p.Name, strings.Join(append(p.Good.HTTP.Slowest, p.Good.TCP.Slowest...), "; "))
		if p.Edge.ExitErr != nil {
			fmt.Fprintf(w, "\nedge exit, %s phase: %v\n", p.Name, p.Edge.ExitErr)
		}
		if len(p.DropWhy) > 0 {
			fmt.Fprintf(w, "\nagent session drops, %s phase: %s\n", p.Name, strings.Join(p.DropWhy, "; "))
		}
	}

	fmt.Fprintf(w, "\nattacks (hostile phase, from 198.51.100.0/24, %d addresses each; stopped in %v):\n",
		cfg.AddrsPerAttack, h.AttackStop.Round(time.Millisecond))
	fmt.Fprintf(w, "   sizes: hello loops %d, pre-hello sessions %d x %d streams, flood %d at once, slow bodies %d (a trickle every %v), idle TCP %d",
		cfg.HelloLoops, cfg.PreHelloConns, cfg.PreHelloStreams, cfg.FloodConcurrency, cfg.SlowBodies, cfg.TrickleEvery, cfg.IdleTCP)
	if cfg.IdleBurst > 0 {
		fmt.Fprintf(w, " (each moving %d bytes first)", cfg.IdleBurst)
	}
	fmt.Fprintf(w, ", half-close %d, bad chunked %d, upgrades %d\n", cfg.HalfClose, cfg.BadChunked, cfg.Upgrades)
	for _, a := range h.Attacks {
		fmt.Fprintln(w, a.describe())
	}
	for _, p := range r.Phases {
		fmt.Fprintf(w, "\nedge log, %s phase: %d lines", p.Name, p.LogLines)
		if keptLogs {
			fmt.Fprintf(w, " (%s)", p.Edge.LogPath)
		}
		fmt.Fprintln(w)
		for _, c := range p.Edge.LogSummary {
			fmt.Fprintf(w, "  %7d  %s\n", c.N, c.Key)
		}
	}
	if r.failures() > 0 {
		fmt.Fprintf(w, "\nFAIL: the well-behaved client had %d failures\n", r.failures())
	} else {
		fmt.Fprintln(w, "\nok: the well-behaved client had no failure")
	}
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
