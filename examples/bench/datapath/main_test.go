//go:build unix

package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// TestMain makes the test binary the program's children too: the rows
// start it again in a role (benchproc.Main), as the program starts
// itself, so that no test builds anything.
func TestMain(m *testing.M) {
	benchproc.Main("datapath.test", roles)
	os.Exit(m.Run())
}

// fullEnv names the variable that, set to 1, runs the tests that take
// tens of seconds (every row, the Go generator on the HTTP rows, two runs
// with profiles). The README's test command runs TestQuick alone of the
// rows; .ci/run runs these too.
const fullEnv = "TUNNELKIT_BENCH_FULL"

// needFull skips t unless fullEnv is 1.
func needFull(t *testing.T) {
	t.Helper()
	if os.Getenv(fullEnv) != "1" {
		t.Skipf("takes tens of seconds: runs with %s=1", fullEnv)
	}
}

// tinyConfig runs rows with the smallest loads that still measure
// something: a smoke test, with no assertion on the figures.
func tinyConfig(t *testing.T, rows ...string) *config {
	cfg := defaultConfig()
	cfg.Rows = rows
	cfg.Duration = 300 * time.Millisecond // wrk takes a second at least
	cfg.Warmup = 50 * time.Millisecond
	cfg.Conns, cfg.Threads, cfg.H2Conns, cfg.H2Streams = 4, 2, 2, 4
	cfg.Download, cfg.Bulk = 1<<20, 1<<20
	cfg.RTTs, cfg.GRPCCalls, cfg.PingPongs = 50, 20, 20
	cfg.ConnWorkers, cfg.Sessions = 2, 5
	cfg.WorkDir = t.TempDir()
	if testing.Verbose() {
		cfg.Verbose, cfg.Log = true, testWriter{t}
	}
	return cfg
}

// runRows runs cfg and checks that every row ran and gave a figure for
// each of its lines.
func runRows(t *testing.T, cfg *config) *report {
	t.Helper()
	var out bytes.Buffer
	return runRowsTo(t, cfg, &out)
}

// runRowsTo is runRows, the report written to out.
func runRowsTo(t *testing.T, cfg *config, out *bytes.Buffer) *report {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg, exe, out)
	t.Logf("report:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.failures) > 0 {
		t.Fatalf("rows failed:\n%s", strings.Join(rep.failures, "\n"))
	}
	for _, row := range cfg.Rows {
		n := 0
		for _, r := range rep.results {
			if r.Row != row {
				continue
			}
			n++
			if math.IsNaN(r.Tun) || math.IsInf(r.Tun, 0) || (r.Row != "idle" && r.Tun <= 0) {
				t.Errorf("%s: tunnel figure %v", r.What, r.Tun)
			}
			if !math.IsNaN(r.Base) && (math.IsInf(r.Base, 0) || r.Base <= 0) {
				t.Errorf("%s: baseline figure %v", r.What, r.Base)
			}
		}
		if n == 0 {
			t.Errorf("row %s: no result", row)
		}
	}
	for _, rec := range rep.cpu {
		for _, p := range rec.Procs {
			if p.Name == "" {
				t.Errorf("%s: a process without a name", rec.Case)
			}
		}
	}
	return rep
}

// TestQuick runs the rtt and idle rows once, with tiny loads and both
// kinds of profiles: the app, the relays, an edge and an agent, the idle
// row's agents, the Go generator, every command of a child, and the
// report. It leaves profiles where -cpuprofile and -memprofile say.
func TestQuick(t *testing.T) {
	cfg := tinyConfig(t, "rtt", "idle")
	cfg.CPUProfile, cfg.MemProfile = t.TempDir(), t.TempDir()
	var out bytes.Buffer
	rep := runRowsTo(t, cfg, &out)
	for _, f := range []string{
		filepath.Join(cfg.CPUProfile, "rtt-base.relay1.cpu.pprof"),
		filepath.Join(cfg.CPUProfile, "rtt-plain.edge.cpu.pprof"),
		filepath.Join(cfg.CPUProfile, "rtt-plain.agent.cpu.pprof"),
		filepath.Join(cfg.MemProfile, "rtt-plain.agent.alloc.pprof"),
		filepath.Join(cfg.MemProfile, "rtt-plain.agent.alloc-start.pprof"),
	} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", filepath.Base(f), err)
		}
	}
	// The idle row's heaps: its edge's at each mem command, its agents'
	// before, after the first session and after the others, for each link.
	for _, pattern := range []string{"mem-*-1.heap.pprof", "mem-*-2.heap.pprof", "agents-*-0.heap.pprof", "agents-*-2.heap.pprof"} {
		if m, _ := filepath.Glob(filepath.Join(cfg.MemProfile, pattern)); len(m) != 2 {
			t.Errorf("heap profiles %s: %d, want one per link", pattern, len(m))
		}
	}
	if len(groupResults(rep.results)) != 2+4 {
		t.Errorf("%d lines, want 2 for rtt and 4 for idle", len(groupResults(rep.results)))
	}
	for _, want := range []string{"| TCP 64 B round trip on an open connection, p50 µs: plaintext link |", "| rtt-plain | 50 RTT | edge "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report has no line %q", want)
		}
	}
}

// TestRows runs every row once with tiny loads; the rows that use wrk or
// h2load skip where they are missing (fail with TUNNELKIT_REQUIRE_TOOLS=1).
func TestRows(t *testing.T) {
	needFull(t)
	tools := map[string][]string{"http": {"wrk"}, "https": {"wrk", "h2load"}}
	for _, name := range rowNames() {
		t.Run(name, func(t *testing.T) {
			testtools.Need(t, tools[name]...)
			cfg := tinyConfig(t, name)
			if len(tools[name]) > 0 {
				cfg.Warmup = 0 // a wrk warm-up takes a whole second
			}
			runRows(t, cfg)
		})
	}
}

// TestGoLoad runs the HTTP rows with the Go load generator, which stands
// in for wrk and h2load where they are missing.
func TestGoLoad(t *testing.T) {
	needFull(t)
	cfg := tinyConfig(t, "http", "https")
	cfg.GoLoad = true
	rep := runRows(t, cfg)
	for _, rec := range rep.cpu {
		if last := rec.Procs[len(rec.Procs)-1].Name; last != "load" {
			t.Errorf("%s: load from %s, want the Go generator", rec.Case, last)
		}
	}
}

// TestProfiles checks that -cpuprofile and -memprofile leave a profile
// per measurement and server process, and that two runs give a ratio
// range.
func TestProfiles(t *testing.T) {
	needFull(t)
	cfg := tinyConfig(t, "rtt")
	cfg.CPUProfile, cfg.MemProfile = t.TempDir(), t.TempDir()
	cfg.Runs = 2
	rep := runRows(t, cfg)
	for _, f := range []string{
		filepath.Join(cfg.CPUProfile, "rtt-base-run1.relay1.cpu.pprof"),
		filepath.Join(cfg.CPUProfile, "rtt-plain-run2.edge.cpu.pprof"),
		filepath.Join(cfg.CPUProfile, "rtt-plain-run1.agent.cpu.pprof"),
		filepath.Join(cfg.MemProfile, "rtt-plain-run2.agent.alloc.pprof"),
		filepath.Join(cfg.MemProfile, "rtt-plain-run2.agent.alloc-start.pprof"),
	} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", filepath.Base(f), err)
		}
	}
	groups := groupResults(rep.results)
	if len(groups) != 2 || len(groups[0].ratios) != 2 {
		t.Fatalf("%d lines, want 2 with 2 ratios each", len(groups))
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 1s test @ http://127.0.0.1:42631/
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    85.93us  320.56us   5.36ms   96.63%
    Req/Sec    46.10k     1.29k   48.02k    63.64%
  50480 requests in 1.10s, 5.10MB read
Requests/sec:  45889.16
Transfer/sec:      4.64MB
`
	res, err := parseWrk([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 50480 || res.Elapsed != 1100*time.Millisecond {
		t.Errorf("%d requests in %v, want 50480 in 1.1s", res.Ops, res.Elapsed)
	}
	for _, bad := range []string{
		strings.Replace(out, "Requests/sec", "  Non-2xx or 3xx responses: 7\nRequests/sec", 1),
		strings.Replace(out, "Requests/sec", "  Socket errors: connect 3, read 0, write 0, timeout 0\nRequests/sec", 1),
		"unable to connect to bench.example.test:http Connection refused",
	} {
		if _, err := parseWrk([]byte(bad)); err == nil {
			t.Errorf("no error for:\n%s", bad)
		}
	}
}

func TestParseH2load(t *testing.T) {
	out := `finished in 504.40ms, 9818.00 req/s, 259.24KB/s
requests: 4909 total, 4917 started, 4909 done, 4909 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 4909 2xx, 0 3xx, 0 4xx, 0 5xx
`
	res, err := parseH2load([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 4909 || res.Elapsed != 504400*time.Microsecond {
		t.Errorf("%d requests in %v, want 4909 in 504.4ms", res.Ops, res.Elapsed)
	}
	for _, bad := range []string{
		strings.Replace(out, "0 failed", "2 failed", 1),
		strings.Replace(out, "0 5xx", "9 5xx", 1),
		"",
	} {
		if _, err := parseH2load([]byte(bad)); err == nil {
			t.Errorf("no error for:\n%s", bad)
		}
	}
}

func TestFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-rows", "idle, http", "-download", "64MiB", "-bulk", "2GB"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.Rows, ",") != "http,idle" || cfg.Download != 64<<20 || cfg.Bulk != 2e9 {
		t.Errorf("rows %v, download %d, bulk %d", cfg.Rows, cfg.Download, cfg.Bulk)
	}
	for _, bad := range [][]string{{"-rows", "nope"}, {"-bulk", "x"}, {"-runs", "0"}, {"-sessions", "1"}, {"extra"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	if p50, p99 := percentiles(d); p50 != 50 || p99 != 99 {
		t.Errorf("p50 %v p99 %v, want 50 and 99", p50, p99)
	}
}

// testWriter logs progress lines to t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
