//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// env is one run of the program: its directory, the tools found, the app
// every path leads to, and what was measured so far.
type env struct {
	cfg    *config
	exe    string // this binary, which every child runs
	dir    string // certificates and wrk scripts
	logDir string // the children's stderr, one file each
	caFile string // the run's CA, which every client trusts
	wrk    string // path; empty: the Go generator instead
	h2load string // path; empty: the Go generator instead

	app                       *benchproc.Proc // the app, for the whole run
	appHTTP, appGRPC, appEcho string          // its addresses

	run      int    // the run under way, from 1
	caseName string // the case under way, which names the log files

	mu       sync.Mutex
	seq      int               // children started so far
	children []*benchproc.Proc // every child started, closed at the end
	cpu      []cpuRecord
}

// report is what run measured, over every run.
type report struct {
	results  []result
	cpu      []cpuRecord
	failures []string // "row: error"
}

// run measures cfg's rows cfg.Runs times with the processes of exe and
// prints the table to out. Rows that fail are reported and the others
// still run; the error is for what keeps every row from running.
func run(ctx context.Context, cfg *config, exe string, out io.Writer) (*report, error) {
	dir := cfg.WorkDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "datapath-"); err != nil {
			return nil, err
		}
	}
	e := &env{cfg: cfg, exe: exe, dir: dir, logDir: filepath.Join(dir, "logs"), caFile: filepath.Join(dir, caFileName)}
	for _, d := range []string{e.logDir, cfg.CPUProfile, cfg.MemProfile} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := writePKI(dir); err != nil {
		return nil, err
	}
	if !cfg.GoLoad {
		e.wrk, _ = exec.LookPath("wrk")
		e.h2load, _ = exec.LookPath("h2load")
	}
	rep := &report{}
	err := e.runRows(ctx, rep)
	e.closeAll()
	if err != nil {
		if ctx.Err() != nil && cfg.WorkDir == "" {
			os.RemoveAll(dir) // interrupted: nothing to look into
			return nil, err
		}
		return nil, fmt.Errorf("%w (logs in %s)", err, e.logDir)
	}
	rep.cpu = e.cpu
	printReport(out, e, rep)
	switch {
	case len(rep.failures) > 0 || cfg.WorkDir != "":
		fmt.Fprintf(out, "\nlogs of every process: %s\n", e.logDir)
	default:
		os.RemoveAll(dir)
	}
	return rep, nil
}

// runRows starts the app and runs every row cfg.Runs times.
func (e *env) runRows(ctx context.Context, rep *report) error {
	e.caseName = "run"
	app, err := e.spawn(ctx, "app", "app", readyTimeout)
	if err != nil {
		return err
	}
	e.app, e.appHTTP, e.appGRPC, e.appEcho = app, app.Fields["http"], app.Fields["grpc"], app.Fields["echo"]
	for e.run = 1; e.run <= e.cfg.Runs; e.run++ {
		for _, name := range e.cfg.Rows {
			r := rowByName(name)
			e.logf("run %d: row %s", e.run, name)
			res, err := r.run(ctx, e)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				rep.failures = append(rep.failures, fmt.Sprintf("%s (run %d): %v", name, e.run, err))
				continue
			}
			for i := range res {
				res[i].Row = name
			}
			rep.results = append(rep.results, res...)
		}
	}
	return e.app.Close()
}

// track registers a child to close at the end whatever happens.
func (e *env) track(c *benchproc.Proc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.children = append(e.children, c)
}

// closeAll closes every child still running, the last started first.
func (e *env) closeAll() {
	e.mu.Lock()
	children := slices.Clone(e.children)
	e.mu.Unlock()
	for _, c := range slices.Backward(children) {
		c.Close()
	}
}

func (e *env) logf(format string, args ...any) {
	if e.cfg.Verbose && e.cfg.Log != nil {
		fmt.Fprintf(e.cfg.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// steps runs a row's cases, each of which starts and stops its own
// processes: in order on odd runs, in reverse on even ones, so that
// drift of the machine over a row falls on baseline and tunnel alike.
func (e *env) steps(steps ...func() error) error {
	if e.run%2 == 0 {
		slices.Reverse(steps)
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// cpuRecord is the CPU time each process took during one measurement.
type cpuRecord struct {
	Case  string
	Procs []procCPU
	Ops   float64 // requests, calls, round trips, connections; or GB
	Unit  string  // what Ops counts: req, call, RTT, conn, GB; empty: nothing meaningful
}

type procCPU struct {
	Name string
	CPU  time.Duration
	IO   benchproc.IO // read and write syscalls; negative: not known
}

// measure runs load while procs count their CPU time (and profile, when
// asked), and records each one's time, and the load generator's, under
// name.
func (e *env) measure(ctx context.Context, name string, procs []*benchproc.Proc, unit string, load func() (loadResult, error)) (loadResult, error) {
	profile := name
	if e.cfg.Runs > 1 {
		profile += "-run" + strconv.Itoa(e.run)
	}
	for _, p := range procs {
		if err := p.StartMeasure(ctx, profile+"."+p.Name); err != nil {
			return loadResult{}, err
		}
	}
	res, err := load()
	rec := cpuRecord{Case: name, Unit: unit}
	for _, p := range procs {
		d, io, serr := p.StopMeasure(ctx)
		if err == nil {
			err = serr
		}
		rec.Procs = append(rec.Procs, procCPU{p.Name, d, io})
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w", name, err)
	}
	rec.Procs = append(rec.Procs, procCPU{res.Tool, res.CPU, benchproc.IO{Reads: -1, Writes: -1}})
	switch unit {
	case "":
	case "GB":
		rec.Ops = float64(res.Bytes) / 1e9
	default:
		rec.Ops = float64(res.Ops)
	}
	e.mu.Lock()
	e.cpu = append(e.cpu, rec)
	e.mu.Unlock()
	e.logf("%s: %d ops in %v", name, res.Ops, res.Elapsed)
	return res, nil
}

// timedHTTP warms t up for -warmup, then measures small GET requests on
// it for -duration while procs count their CPU time.
func (e *env) timedHTTP(ctx context.Context, name string, procs []*benchproc.Proc, t target, h2 bool) (loadResult, error) {
	if e.cfg.Warmup > 0 {
		if _, err := e.httpLoad(ctx, t, e.cfg.Warmup, h2); err != nil {
			return loadResult{}, fmt.Errorf("%s: warm-up: %w", name, err)
		}
	}
	return e.measure(ctx, name, procs, "req", func() (loadResult, error) {
		return e.httpLoad(ctx, t, e.cfg.Duration, h2)
	})
}

// goLoad runs the Go load generator with args plus scale=full while procs
// count their CPU time, after a warm-up run with a tenth of full (or
// -warmup for -d), unless -warmup is 0.
func (e *env) goLoad(ctx context.Context, name string, procs []*benchproc.Proc, unit string, args []string, scale string, full int64) (loadResult, error) {
	if e.cfg.Warmup > 0 {
		warm := strconv.FormatInt(max(full/10, 1), 10)
		if scale == "-d" {
			warm = e.cfg.Warmup.String()
		}
		if _, err := e.runLoad(ctx, "load", append(slices.Clone(args), scale, warm)...); err != nil {
			return loadResult{}, fmt.Errorf("%s: warm-up: %w", name, err)
		}
	}
	v := strconv.FormatInt(full, 10)
	if scale == "-d" {
		v = time.Duration(full).String()
	}
	return e.measure(ctx, name, procs, unit, func() (loadResult, error) {
		return e.runLoad(ctx, "load", append(slices.Clone(args), scale, v)...)
	})
}

// tunnel is an edge and an agent exposing an endpoint.
type tunnel struct {
	edge, agent *benchproc.Proc
	url         *url.URL // the public URL
	connect     string   // the loopback address it is served on
}

// procs returns the tunnel's processes and the app's.
func (t *tunnel) procs(app *benchproc.Proc) []*benchproc.Proc {
	return []*benchproc.Proc{t.edge, t.agent, app}
}

// endpoint is what an agent exposes.
type endpoint struct {
	url      string // "http://bench", "https://grpc", "tcp://"
	appProto string // "", "h2c"
	to       string // the app's address
	bytes    bool   // copy bytes (-log-requests=false) rather than forward requests
}

// Agent links.
const (
	plainLink = "plain"
	tlsLink   = "tls"
)

// withTunnel starts an edge whose agent port speaks link and an agent
// that exposes ep through it, runs f, and stops them.
func (e *env) withTunnel(ctx context.Context, name, link string, ep endpoint, f func(*tunnel) error) (err error) {
	e.caseName = name
	edgeArgs := []string{"-dir", e.dir, "-link", link}
	if !e.cfg.Logs {
		edgeArgs = append(edgeArgs, "-access-log=false")
	}
	edge, err := e.spawn(ctx, "edge", "edge", readyTimeout, edgeArgs...)
	if err != nil {
		return err
	}
	defer closeInto(&err, edge)
	agentArgs := []string{"-edge", edge.Fields["agents"], "-url", ep.url, "-to", ep.to}
	if ep.appProto != "" {
		agentArgs = append(agentArgs, "-app-protocol", ep.appProto)
	}
	if ep.bytes {
		agentArgs = append(agentArgs, "-log-requests=false")
	}
	if link == tlsLink {
		agentArgs = append(agentArgs, "-edge-ca", e.caFile)
	}
	if !e.cfg.Logs {
		agentArgs = append(agentArgs, "-quiet")
	}
	agent, err := e.spawn(ctx, "agent", "agent", readyTimeout, agentArgs...)
	if err != nil {
		return err
	}
	defer closeInto(&err, agent)
	u, err := url.Parse(agent.Fields["url"])
	if err != nil || u.Port() == "" {
		return fmt.Errorf("agent: public URL %q: want one with a port", agent.Fields["url"])
	}
	return f(&tunnel{edge: edge, agent: agent, url: u, connect: "127.0.0.1:" + u.Port()})
}

// withProxy starts the baseline ReverseProxy with args, runs f, and stops
// it.
func (e *env) withProxy(ctx context.Context, name string, args []string, f func(rp *benchproc.Proc) error) (err error) {
	e.caseName = name
	rp, err := e.spawn(ctx, "rproxy", "rproxy", readyTimeout, args...)
	if err != nil {
		return err
	}
	defer closeInto(&err, rp)
	return f(rp)
}

// withRelays starts the TCP baseline, two relays in a chain to the echo,
// runs f with them and the address of the first, and stops them.
func (e *env) withRelays(ctx context.Context, name string, f func(procs []*benchproc.Proc, connect string) error) (err error) {
	e.caseName = name
	r2, err := e.spawn(ctx, "relay2", "relay", readyTimeout, "-to", e.appEcho)
	if err != nil {
		return err
	}
	defer closeInto(&err, r2)
	r1, err := e.spawn(ctx, "relay1", "relay", readyTimeout, "-to", r2.Fields["addr"])
	if err != nil {
		return err
	}
	defer closeInto(&err, r1)
	return f([]*benchproc.Proc{r1, r2, e.app}, r1.Fields["addr"])
}

// closeInto closes c and keeps its error in *err unless *err holds one.
func closeInto(err *error, c *benchproc.Proc) {
	if cerr := c.Close(); *err == nil && cerr != nil {
		*err = cerr
	}
}
