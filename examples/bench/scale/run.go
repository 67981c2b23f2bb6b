//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// result is what a run measured; its JSON names are the issue's.
type result struct {
	Date   string `json:"date"`
	Edges  int    `json:"edges"`
	Agents int    `json:"agents"`

	Bound       int     `json:"bound"`
	BindSeconds float64 `json:"bind_seconds"`
	BindRetries int64   `json:"bind_retries"`
	// The CPU seconds each kind of process spent over the bind: what a
	// bind costs, and where.
	BindCPU cpuSplit `json:"bind_cpu_seconds"`

	EdgeBytesPerSession      float64 `json:"edge_bytes_per_session"`
	EdgeHeapPerSession       float64 `json:"edge_heap_per_session"`
	EdgeStackPerSession      float64 `json:"edge_stack_per_session"`
	EdgeGoroutinesPerSession float64 `json:"edge_goroutines_per_session"`
	RouteCacheBytes          float64 `json:"route_cache_bytes"`           // of one edge: the observer's growth
	RouteCacheBytesPerRoute  float64 `json:"route_cache_bytes_per_route"` // the same, per route
	EdgeHeapMiB              []int64 `json:"edge_heap_mib"`               // each edge's heap and stacks after the bind

	IdleSeconds         float64 `json:"idle_seconds"`
	IdleCPUCores        float64 `json:"idle_cpu_cores"` // edges (the observer too) and etcd
	IdleCPUCoresEdges   float64 `json:"idle_cpu_cores_edges"`
	IdleCPUCoresEtcd    float64 `json:"idle_cpu_cores_etcd"`
	IdleCPUCoresAgents  float64 `json:"idle_cpu_cores_agents"`
	EtcdDBBytes         float64 `json:"etcd_db_bytes"`
	EtcdDBInUseBytes    float64 `json:"etcd_db_in_use_bytes"`
	EtcdRSSBytes        int64   `json:"etcd_rss_bytes"`
	AgentProcessRSSMiB  int64   `json:"agent_processes_rss_mib"`
	EdgeProcessesRSSMiB int64   `json:"edge_processes_rss_mib"`

	Baseline      latencyStats `json:"baseline"` // at -baseline agents
	BaselineNames int          `json:"baseline_agents"`
	Load          latencyStats `json:"load"` // at every agent
	RequestP50Ms  float64      `json:"request_p50_ms"`
	RequestP99Ms  float64      `json:"request_p99_ms"`
	RequestErrors int          `json:"request_errors"`

	Kill    *killResult    `json:"kill,omitempty"`
	Rolling *rollingResult `json:"rolling,omitempty"`

	Failures []string `json:"failures"` // what -check fails on
	Notes    []string `json:"notes,omitempty"`
}

// cpuSplit is CPU time by kind of process, in seconds.
type cpuSplit struct {
	Edges    float64 `json:"edges"`    // the edges that hold agents
	Observer float64 `json:"observer"` // the edge that holds none: its route cache
	Etcd     float64 `json:"etcd"`
	Agents   float64 `json:"agents"` // the agent processes
}

// cpuNow returns the CPU time of the run's processes so far.
func (h *harness) cpuNow() cpuSplit {
	var c cpuSplit
	for _, e := range h.edges {
		c.Edges += e.cpu().Seconds()
	}
	c.Observer = h.observer.cpu().Seconds()
	c.Etcd = h.etcd.cpu().Seconds()
	for _, a := range h.agents {
		c.Agents += benchproc.CPUTime(a.Pid()).Seconds()
	}
	return c
}

func (c cpuSplit) sub(o cpuSplit) cpuSplit {
	return cpuSplit{c.Edges - o.Edges, c.Observer - o.Observer, c.Etcd - o.Etcd, c.Agents - o.Agents}
}

type killResult struct {
	Edge          string  `json:"edge"`
	Agents        int     `json:"agents"`   // held by the killed edge
	Rebound       int     `json:"rebound"`  // bound again on another edge
	SameURL       int     `json:"same_url"` // of those, with the URL of their first bind
	ReboundP50S   float64 `json:"rebound_p50_s"`
	ReboundP99S   float64 `json:"rebound_p99_s"`
	ReboundMaxS   float64 `json:"rebound_max_s"`
	RequestsOther int     `json:"requests_other"`
	FailedOther   int     `json:"failed_other"` // to names the killed edge did not hold
	RequestsMoved int     `json:"requests_moved"`
	FailedMoved   int     `json:"failed_moved"` // to its names, while they moved
}

type rollingResult struct {
	Edges      int       `json:"edges"`
	Seconds    float64   `json:"seconds"`
	DrainS     []float64 `json:"drain_s"` // each edge's exit after SIGTERM
	Requests   int       `json:"requests"`
	Failed     int       `json:"failed"`
	BoundAfter int       `json:"bound_after"`
	SameURL    int       `json:"same_url"`
}

// harness is a run's processes.
type harness struct {
	cfg      config
	log      io.Writer
	dir      string
	bin      string
	etcd     *proc
	etcdAddr string
	edges    []*edgeProc // the cluster's, which agents and requests use
	observer *edgeProc   // an edge of the cluster that no agent uses
	agents   []*benchproc.Proc
	status   []string // each agent process's status address
	lb       *balancer
	client   *http.Client
	token    string
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "%s scale: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// run runs every phase and returns what it measured: a partial result
// with an error when a phase failed.
func run(ctx context.Context, cfg config, log io.Writer) (*result, error) {
	// An agent process that cannot answer within 10 s is starved: the
	// phase's own deadline decides what that means.
	h := &harness{cfg: cfg, log: log, client: &http.Client{Timeout: 10 * time.Second}}
	res := &result{Date: time.Now().UTC().Format(time.RFC3339), Edges: cfg.edges, Agents: cfg.agents, Failures: []string{}}
	if err := h.setup(ctx); err != nil {
		h.close()
		return nil, err
	}
	defer h.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go h.lb.check(ctx, 250*time.Millisecond)
	err := h.phases(ctx, res)
	return res, err
}

func (h *harness) setup(ctx context.Context) error {
	cfg := h.cfg
	h.dir = cfg.workdir
	if h.dir == "" {
		d, err := os.MkdirTemp("", "scale-")
		if err != nil {
			return err
		}
		h.dir = d
	} else if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	h.logf("work directory %s", h.dir)
	h.bin = cfg.tunnelkit
	if h.bin == "" {
		h.bin = filepath.Join(h.dir, "tunnelkit")
		h.logf("go build tunnelkit")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", h.bin, "github.com/tunnelkit/tunnelkit/examples/tunnelkit")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build tunnelkit: %v\n%s", err, out)
		}
	}
	p, err := newPKI(h.dir)
	if err != nil {
		return err
	}
	ticketKey := filepath.Join(h.dir, "ticket.key")
	adminToken := filepath.Join(h.dir, "admin-token")
	h.token = randomHex(16)
	if err := os.WriteFile(ticketKey, []byte(randomHex(32)+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(adminToken, []byte(randomHex(16)+"\n"), 0o600); err != nil {
		return err
	}
	h.etcd, h.etcdAddr, err = startEtcd(ctx, cfg.etcd, h.dir)
	if err != nil {
		return err
	}
	h.logf("etcd on %s", h.etcdAddr)
	n := cfg.edges + 1
	ports, err := benchproc.FreePorts(5 * n)
	if err != nil {
		return err
	}
	all := make([]*edgeProc, n)
	for i := range all {
		name := "e" + strconv.Itoa(i+1)
		if i == cfg.edges {
			name = "observer"
		}
		e := &edgeProc{
			agents: benchproc.Loopback(ports[5*i]), http: benchproc.Loopback(ports[5*i+1]),
			relay: benchproc.Loopback(ports[5*i+2]), admin: benchproc.Loopback(ports[5*i+3]),
			pprof: benchproc.Loopback(ports[5*i+4]),
		}
		cert, key, err := p.issueEdge(name, e.relay)
		if err != nil {
			return err
		}
		e.proc = proc{name: name, path: h.bin, logPath: filepath.Join(h.dir, name+".log"), args: []string{
			"edge", "-domain", domain, "-agents", e.agents, "-http", e.http, "-access-log=false", "-log-level", cfg.edgeLog,
			"-agent-cert", cert, "-agent-key", key, "-ticket-key", ticketKey, "-token", h.token,
			"-etcd", "http://" + h.etcdAddr,
			"-relay", e.relay, "-relay-cert", cert, "-relay-key", key, "-relay-ca", filepath.Join(h.dir, caFile),
			"-admin", e.admin, "-admin-token-file", adminToken, "-pprof", e.pprof,
			"-drain-timeout", cfg.drainTimeout.String(), "-drain-notice", "1s", "-public-http-port", "80",
			// At scale: one identity holds every name, and every agent
			// comes from 127.0.0.1. A fleet's moves have some binds
			// refused (a name its previous session, on an edge the store
			// has not heard from yet, still holds), and counted together
			// they would make all its binds wait (-max-refused-binds).
			"-max-sessions-per-identity", "-1", "-max-endpoints-per-identity", "-1", "-max-endpoints-total", "-1",
			"-max-pending", "-1", "-max-pending-per-source", "-1", "-max-refused-binds", "-1",
		}}
		if cfg.edgeGOGC != "" {
			e.env = append(e.env, "GOGC="+cfg.edgeGOGC)
		}
		if cfg.edgeMem != "" {
			e.env = append(e.env, "GOMEMLIMIT="+cfg.edgeMem)
		}
		if cfg.etcdTTL > 0 {
			e.args = append(e.args, "-etcd-ttl", cfg.etcdTTL.String())
		}
		if cfg.heartbeat > 0 {
			e.args = append(e.args, "-heartbeat-interval", cfg.heartbeat.String())
		}
		all[i] = e
	}
	h.edges, h.observer = all[:cfg.edges], all[cfg.edges]
	if err := each(all, func(e *edgeProc) error { return e.startAndWait(ctx, nil) }); err != nil {
		return err
	}
	for _, e := range all {
		h.logf("%s: agents %s, http %s, relay %s, admin %s, pprof %s", e.name, e.agents, e.http, e.relay, e.admin, e.pprof)
	}
	h.logf("%d edges and the observer up", cfg.edges)
	h.lb = newBalancer(h.edges)
	return nil
}

// each runs f on every edge at once, and returns the first error.
func each(edges []*edgeProc, f func(*edgeProc) error) error {
	errs := make([]error, len(edges))
	var wg sync.WaitGroup
	for i, e := range edges {
		wg.Go(func() { errs[i] = f(e) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (h *harness) close() {
	var wg sync.WaitGroup
	for _, a := range h.agents {
		wg.Go(func() { a.Close() })
	}
	wg.Wait()
	for _, e := range h.edges {
		e.kill()
	}
	if h.observer != nil {
		h.observer.kill()
	}
	if h.etcd != nil {
		h.etcd.kill()
	}
	if h.cfg.workdir == "" && h.dir != "" {
		os.RemoveAll(h.dir)
	}
}

func (h *harness) phases(ctx context.Context, res *result) error {
	cfg := h.cfg
	// 1. The baseline.
	if err := h.startAgents(ctx, 0, cfg.baseline); err != nil {
		return err
	}
	if _, err := h.waitBound(ctx, cfg.baseline, cfg.bindTimeout, time.Time{}); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	time.Sleep(time.Second) // every edge's cache has the routes
	h.logf("baseline: %d agents bound; %d requests/s for %v", cfg.baseline, cfg.rate, cfg.load)
	var errs []string
	res.Baseline, errs = stats(h.lb.load(ctx, cfg.rate, cfg.baseline, cfg.load))
	res.BaselineNames = cfg.baseline
	h.failIf(res, res.Baseline.Errors > 0, "baseline: %d of %d requests failed: %q", res.Baseline.Errors, res.Baseline.Requests, errs)
	h.logf("baseline: p50 %.2f ms, p99 %.2f ms, %d errors", res.Baseline.P50Ms, res.Baseline.P99Ms, res.Baseline.Errors)

	before, err := h.mems(ctx)
	if err != nil {
		return err
	}

	// 2. The bind.
	cpu0 := h.cpuNow()
	start := time.Now()
	for first := cfg.baseline; first < cfg.agents; first += cfg.perProcess {
		if err := h.startAgents(ctx, first, min(cfg.perProcess, cfg.agents-first)); err != nil {
			return err
		}
	}
	rep, err := h.waitBound(ctx, cfg.agents, cfg.bindTimeout, start)
	res.Bound, res.BindRetries = rep.Up, rep.Failed
	if err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	res.BindSeconds = time.Since(start).Seconds()
	res.BindCPU = h.cpuNow().sub(cpu0)
	h.logf("bind: %d agents bound in %.1f s (%d binds tried again)", res.Bound, res.BindSeconds, res.BindRetries)

	// 3. Idle.
	time.Sleep(cfg.settle)
	after, err := h.mems(ctx)
	if err != nil {
		return err
	}
	h.perSession(res, before, after)
	if err := h.idle(ctx, res); err != nil {
		return err
	}

	// 4. The load at every agent.
	h.logf("load: %d requests/s to %d names for %v", cfg.rate, cfg.agents, cfg.load)
	res.Load, errs = stats(h.lb.load(ctx, cfg.rate, cfg.agents, cfg.load))
	res.RequestP50Ms, res.RequestP99Ms, res.RequestErrors = res.Load.P50Ms, res.Load.P99Ms, res.Load.Errors
	h.failIf(res, res.Load.Errors > 0, "load: %d of %d requests failed: %q", res.Load.Errors, res.Load.Requests, errs)
	h.logf("load: p50 %.2f ms, p99 %.2f ms (baseline %.2f, %.2f), %d errors", res.Load.P50Ms, res.Load.P99Ms, res.Baseline.P50Ms, res.Baseline.P99Ms, res.Load.Errors)

	// 5. kill -9.
	if cfg.kill {
		if err := h.killPhase(ctx, res); err != nil {
			return fmt.Errorf("kill: %w", err)
		}
	}
	// 6. The rolling restart.
	if cfg.rolling {
		if err := h.rollingPhase(ctx, res); err != nil {
			return fmt.Errorf("rolling: %w", err)
		}
	}
	return nil
}

// failIf records a failure of a check that -check makes.
func (h *harness) failIf(res *result, failed bool, format string, args ...any) {
	if failed {
		msg := fmt.Sprintf(format, args...)
		res.Failures = append(res.Failures, msg)
		h.logf("FAILED: %s", msg)
	}
}

// startAgents starts an agent process for the agents [first, first+count).
func (h *harness) startAgents(ctx context.Context, first, count int) error {
	addrs := make([]string, len(h.edges))
	for i, e := range h.edges {
		addrs[i] = e.agents
	}
	n := len(h.agents)
	args := []string{"-edges", strings.Join(addrs, ","), "-first", strconv.Itoa(first), "-count", strconv.Itoa(count),
		"-token", h.token, "-ca", filepath.Join(h.dir, caFile), "-workers", strconv.Itoa(h.cfg.workers),
		"-seed", strconv.Itoa(n + 1)}
	if h.cfg.heartbeat > 0 {
		args = append(args, "-heartbeat", h.cfg.heartbeat.String())
	}
	if h.cfg.agentLog != "" {
		args = append(args, "-log-level", h.cfg.agentLog)
	}
	var env []string
	if h.cfg.agentGOGC != "" {
		env = append(env, "GOGC="+h.cfg.agentGOGC)
	}
	if h.cfg.agentMem != "" {
		env = append(env, "GOMEMLIMIT="+h.cfg.agentMem)
	}
	p, err := benchproc.Start(ctx, benchproc.Options{
		Name: fmt.Sprintf("agents%d", n), Role: "agents", Args: args, Env: env, Nice: h.cfg.agentNice,
		LogPath: filepath.Join(h.dir, fmt.Sprintf("agents%d.log", n)), ReadyTimeout: time.Minute,
	})
	if err != nil {
		return err
	}
	h.agents = append(h.agents, p)
	h.status = append(h.status, p.Fields["status"])
	return nil
}

// report sums the agent processes' reports (since: see agentsReport).
func (h *harness) report(ctx context.Context, since time.Time) (agentsReport, error) {
	sum := agentsReport{ByEdge: map[string]int{}}
	for i, addr := range h.status {
		select {
		case <-h.agents[i].Exited():
			return sum, h.agents[i].Failure("report", errors.New("the agent process exited"))
		default:
		}
		var r agentsReport
		url := "http://" + addr + "/status"
		if !since.IsZero() {
			url += "?since=" + strconv.FormatInt(since.UnixNano(), 10)
		}
		if err := getJSON(ctx, h.client, url, false, &r); err != nil {
			return sum, err
		}
		sum.Total += r.Total
		sum.Listening += r.Listening
		sum.Up += r.Up
		sum.SameURL += r.SameURL
		sum.Failed += r.Failed
		sum.Downs += r.Downs
		sum.MarkedOn += r.MarkedOn
		sum.Rebound += r.Rebound
		sum.MarkedURLs += r.MarkedURLs
		sum.ReboundMs = append(sum.ReboundMs, r.ReboundMs...)
		for k, v := range r.ByEdge {
			sum.ByEdge[k] += v
		}
	}
	return sum, nil
}

// waitBound waits until n agents are listening and up, and logs the
// progress every 10 s (from start, if not zero).
func (h *harness) waitBound(ctx context.Context, n int, timeout time.Duration, start time.Time) (agentsReport, error) {
	deadline := time.Now().Add(timeout)
	logged := time.Now()
	for {
		rep, err := h.report(ctx, time.Time{})
		if err != nil {
			return rep, err
		}
		if rep.Listening >= n && rep.Up >= n {
			return rep, nil
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("%d of %d agents bound (%d listening) after %v", rep.Up, n, rep.Listening, timeout)
		}
		if !start.IsZero() && time.Since(logged) >= 10*time.Second {
			logged = time.Now()
			h.logf("  %d of %d bound after %.0f s", rep.Up, n, time.Since(start).Seconds())
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// mems reads every edge's memory, the observer's last.
func (h *harness) mems(ctx context.Context) ([]mem, error) {
	all := append(append([]*edgeProc(nil), h.edges...), h.observer)
	ms := make([]mem, len(all))
	for i, e := range all {
		var err error
		if ms[i], err = e.readMem(ctx); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// perSession computes what a session costs an edge: what the edges grew
// by over the bind, each less what the observer (every route, no session)
// grew by, over the sessions bound meanwhile.
func (h *harness) perSession(res *result, before, after []mem) {
	n := len(h.edges)
	obs := func(f func(mem) int64) float64 { return float64(f(after[n]) - f(before[n])) }
	heap := func(m mem) int64 { return m.heap }
	stack := func(m mem) int64 { return m.stack }
	gor := func(m mem) int64 { return m.goroutines }
	var dHeap, dStack, dGor float64
	for i := range n {
		dHeap += float64(after[i].heap-before[i].heap) - obs(heap)
		dStack += float64(after[i].stack-before[i].stack) - obs(stack)
		dGor += float64(after[i].goroutines-before[i].goroutines) - obs(gor)
		res.EdgeHeapMiB = append(res.EdgeHeapMiB, (after[i].heap+after[i].stack)>>20)
	}
	sessions := float64(h.cfg.agents - h.cfg.baseline)
	res.EdgeHeapPerSession = dHeap / sessions
	res.EdgeStackPerSession = dStack / sessions
	res.EdgeBytesPerSession = (dHeap + dStack) / sessions
	res.EdgeGoroutinesPerSession = dGor / sessions
	res.RouteCacheBytes = obs(heap)
	res.RouteCacheBytesPerRoute = obs(heap) / sessions
	h.logf("idle sessions: %.0f B each at the edge (heap %.0f + stacks %.0f), %.3f goroutines each; route cache %.0f B per route at each edge",
		res.EdgeBytesPerSession, res.EdgeHeapPerSession, res.EdgeStackPerSession, res.EdgeGoroutinesPerSession, res.RouteCacheBytesPerRoute)
}

// idle measures the CPU of the idle cluster over cfg.idle, and etcd.
func (h *harness) idle(ctx context.Context, res *result) error {
	servers := append(append([]*edgeProc(nil), h.edges...), h.observer)
	cpu := func() (edges, etcd, agents time.Duration) {
		for _, e := range servers {
			edges += e.cpu()
		}
		for _, a := range h.agents {
			agents += benchproc.CPUTime(a.Pid())
		}
		return edges, h.etcd.cpu(), agents
	}
	h.logf("idle: CPU over %v", h.cfg.idle)
	e0, d0, a0 := cpu()
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(h.cfg.idle):
	}
	e1, d1, a1 := cpu()
	wall := time.Since(t0)
	res.IdleSeconds = wall.Seconds()
	res.IdleCPUCoresEdges = float64(e1-e0) / float64(wall)
	res.IdleCPUCoresEtcd = float64(d1-d0) / float64(wall)
	res.IdleCPUCoresAgents = float64(a1-a0) / float64(wall)
	res.IdleCPUCores = res.IdleCPUCoresEdges + res.IdleCPUCoresEtcd
	m, err := etcdMetrics(ctx, h.etcdAddr)
	if err != nil {
		return err
	}
	res.EtcdDBBytes = m["etcd_mvcc_db_total_size_in_bytes"]
	res.EtcdDBInUseBytes = m["etcd_mvcc_db_total_size_in_use_in_bytes"]
	if st, err := benchproc.Status(h.etcd.cmd.Process.Pid); err == nil {
		res.EtcdRSSBytes = st["VmRSS"] << 10 // KiB
	}
	for _, a := range h.agents {
		if st, err := benchproc.Status(a.Pid()); err == nil {
			res.AgentProcessRSSMiB += st["VmRSS"] >> 10 // KiB
		}
	}
	for _, e := range servers {
		if st, err := benchproc.Status(e.cmd.Process.Pid); err == nil {
			res.EdgeProcessesRSSMiB += st["VmRSS"] >> 10
		}
	}
	h.logf("idle: %.3f cores (edges %.3f, etcd %.3f; the agents' processes %.3f); etcd's database %.1f MiB",
		res.IdleCPUCores, res.IdleCPUCoresEdges, res.IdleCPUCoresEtcd, res.IdleCPUCoresAgents, res.EtcdDBBytes/(1<<20))
	return nil
}

// killPhase kills the first edge under load and waits for its agents to
// be bound elsewhere.
func (h *harness) killPhase(ctx context.Context, res *result) error {
	victim := h.edges[0]
	moved := map[int]bool{}
	for _, addr := range h.status {
		var r agentsReport
		if err := getJSON(ctx, h.client, "http://"+addr+"/mark?edge="+victim.agents, true, &r); err != nil {
			return err
		}
		for _, i := range r.Names {
			moved[i] = true
		}
	}
	k := &killResult{Edge: victim.name, Agents: len(moved)}
	res.Kill = k
	if k.Agents == 0 {
		return fmt.Errorf("%s holds no agent", victim.name)
	}
	h.logf("kill: kill -9 %s, which holds %d agents, under %d requests/s", victim.name, k.Agents, h.cfg.rate)
	stopLoad := h.lb.start(ctx, h.cfg.rate, h.cfg.agents)
	time.Sleep(2 * time.Second)
	killed := time.Now()
	victim.kill()
	var rep agentsReport
	err := waitFor(ctx, h.cfg.rebindTimeout, func() error {
		var err error
		if rep, err = h.report(ctx, killed); err != nil {
			return err
		}
		if rep.Rebound < k.Agents {
			return fmt.Errorf("%d of %d agents bound again", rep.Rebound, k.Agents)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	samples := stopLoad()
	k.Rebound, k.SameURL = rep.Rebound, rep.MarkedURLs
	for i := range rep.ReboundMs {
		rep.ReboundMs[i] /= 1000
	}
	k.ReboundP50S, k.ReboundP99S, k.ReboundMaxS = percentile(rep.ReboundMs, 50), percentile(rep.ReboundMs, 99), percentile(rep.ReboundMs, 100)
	var otherErrs []string
	for _, s := range samples {
		if moved[s.name] {
			k.RequestsMoved++
			if s.err != "" {
				k.FailedMoved++
			}
			continue
		}
		k.RequestsOther++
		if s.err != "" {
			k.FailedOther++
			if len(otherErrs) < 5 {
				otherErrs = append(otherErrs, fmt.Sprintf("%s at +%.3f s: %s", agentName(s.name), s.at.Sub(killed).Seconds(), s.err))
			}
		}
	}
	h.logf("kill: %d of %d agents bound again (%d with the same URL): p50 %.2f s, p99 %.2f s, max %.2f s; failed requests: %d of %d to the others' names, %d of %d to the moved names",
		k.Rebound, k.Agents, k.SameURL, k.ReboundP50S, k.ReboundP99S, k.ReboundMaxS, k.FailedOther, k.RequestsOther, k.FailedMoved, k.RequestsMoved)
	h.failIf(res, k.Rebound < k.Agents, "kill: %d of %d agents bound again within %v", k.Rebound, k.Agents, h.cfg.rebindTimeout)
	h.failIf(res, k.SameURL < k.Agents, "kill: %d of %d agents got their URL back", k.SameURL, k.Agents)
	h.failIf(res, k.FailedOther > 0, "kill: %d requests to names the killed edge did not hold failed: %q", k.FailedOther, otherErrs)
	if err != nil {
		return err
	}
	h.logf("kill: %s started again", victim.name)
	return victim.startAndWait(ctx, h.logf)
}

// rollingPhase stops each edge in turn with SIGTERM and starts it again,
// under load.
func (h *harness) rollingPhase(ctx context.Context, res *result) error {
	r := &rollingResult{Edges: len(h.edges)}
	res.Rolling = r
	h.logf("rolling: each of %d edges drained and started again, under %d requests/s", len(h.edges), h.cfg.rate)
	stopLoad := h.lb.start(ctx, h.cfg.rate, h.cfg.agents)
	start := time.Now()
	var phaseErr error
	for _, e := range h.edges {
		took, err := e.terminate(h.cfg.drainTimeout + 15*time.Second)
		r.DrainS = append(r.DrainS, took.Seconds())
		if err == nil && e.cmd.ProcessState != nil && !e.cmd.ProcessState.Success() {
			err = fmt.Errorf("%s exited with %v after SIGTERM\n%s", e.name, e.cmd.ProcessState, e.tail())
		}
		if err == nil {
			err = e.startAndWait(ctx, h.logf)
		}
		if err != nil {
			phaseErr = err
			break
		}
		h.logf("rolling: %s drained in %.1f s and started again", e.name, took.Seconds())
		time.Sleep(time.Second)
	}
	r.Seconds = time.Since(start).Seconds()
	time.Sleep(2 * time.Second)
	samples := stopLoad()
	st, errs := stats(samples)
	r.Requests, r.Failed = st.Requests, st.Errors
	rep, err := h.waitBound(ctx, h.cfg.agents, h.cfg.rebindTimeout, time.Time{})
	r.BoundAfter, r.SameURL = rep.Up, rep.SameURL
	h.logf("rolling: %.0f s; %d of %d requests failed; %d agents bound after it, %d with their first URL", r.Seconds, r.Failed, r.Requests, r.BoundAfter, r.SameURL)
	h.failIf(res, r.Failed > 0, "rolling: %d of %d requests failed: %q", r.Failed, r.Requests, errs)
	h.failIf(res, r.BoundAfter < h.cfg.agents, "rolling: %d of %d agents bound after it", r.BoundAfter, h.cfg.agents)
	h.failIf(res, r.SameURL < h.cfg.agents, "rolling: %d of %d agents kept their URL", r.SameURL, h.cfg.agents)
	if phaseErr != nil {
		return phaseErr
	}
	return err
}

// printTable writes the results as a table.
func printTable(w io.Writer, r *result) {
	row := func(k, v string) { fmt.Fprintf(w, "| %-44s | %s |\n", k, v) }
	fmt.Fprintf(w, "\n| %-44s | %s |\n|%s|---|\n", "scale run "+r.Date, "", strings.Repeat("-", 46))
	row("edges, agents", fmt.Sprintf("%d, %d", r.Edges, r.Agents))
	row("bound, in", fmt.Sprintf("%d, %.1f s (%d binds tried again)", r.Bound, r.BindSeconds, r.BindRetries))
	b := r.BindCPU
	row("  CPU of the bind", fmt.Sprintf("%.0f s: edges %.0f, each edge's route cache %.1f, etcd %.0f, agents %.0f", b.Edges+b.Observer+b.Etcd+b.Agents, b.Edges, b.Observer, b.Etcd, b.Agents))
	row("edge memory per idle session", fmt.Sprintf("%.0f B (heap %.0f, stacks %.0f)", r.EdgeBytesPerSession, r.EdgeHeapPerSession, r.EdgeStackPerSession))
	row("edge goroutines per idle session", fmt.Sprintf("%.3f", r.EdgeGoroutinesPerSession))
	row("route cache of each edge", fmt.Sprintf("%.1f MiB, %.0f B per route", r.RouteCacheBytes/(1<<20), r.RouteCacheBytesPerRoute))
	row("idle CPU: edges + etcd (agents apart)", fmt.Sprintf("%.3f cores (edges %.3f, etcd %.3f; agents %.3f) over %.0f s", r.IdleCPUCores, r.IdleCPUCoresEdges, r.IdleCPUCoresEtcd, r.IdleCPUCoresAgents, r.IdleSeconds))
	row("etcd database, in use, RSS", fmt.Sprintf("%.1f MiB, %.1f MiB, %d MiB", r.EtcdDBBytes/(1<<20), r.EtcdDBInUseBytes/(1<<20), r.EtcdRSSBytes>>20))
	row("RSS: edges, agent processes", fmt.Sprintf("%d MiB, %d MiB", r.EdgeProcessesRSSMiB, r.AgentProcessRSSMiB))
	row(fmt.Sprintf("requests at %d agents: p50, p99, errors", r.BaselineNames), fmt.Sprintf("%.2f ms, %.2f ms, %d of %d", r.Baseline.P50Ms, r.Baseline.P99Ms, r.Baseline.Errors, r.Baseline.Requests))
	row(fmt.Sprintf("requests at %d agents: p50, p99, errors", r.Agents), fmt.Sprintf("%.2f ms, %.2f ms, %d of %d", r.Load.P50Ms, r.Load.P99Ms, r.Load.Errors, r.Load.Requests))
	if r.Baseline.P50Ms > 0 && r.Baseline.P99Ms > 0 && r.Load.Requests > 0 {
		row("  against the baseline", fmt.Sprintf("p50 %.2fx, p99 %.2fx", r.Load.P50Ms/r.Baseline.P50Ms, r.Load.P99Ms/r.Baseline.P99Ms))
	}
	if k := r.Kill; k != nil {
		row("kill -9 of "+k.Edge+": agents, rebound, same URL", fmt.Sprintf("%d, %d, %d", k.Agents, k.Rebound, k.SameURL))
		row("  rebound after the kill: p50, p99, max", fmt.Sprintf("%.2f s, %.2f s, %.2f s", k.ReboundP50S, k.ReboundP99S, k.ReboundMaxS))
		row("  failed requests: other names, moved names", fmt.Sprintf("%d of %d, %d of %d", k.FailedOther, k.RequestsOther, k.FailedMoved, k.RequestsMoved))
	}
	if g := r.Rolling; g != nil {
		row(fmt.Sprintf("rolling restart of %d edges", g.Edges), fmt.Sprintf("%.0f s; %d of %d requests failed; %d bound after, %d same URL", g.Seconds, g.Failed, g.Requests, g.BoundAfter, g.SameURL))
	}
	for _, f := range r.Failures {
		row("FAILED", f)
	}
}
