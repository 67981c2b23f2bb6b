//go:build unix

// Command datapath measures tunnelkit's data path against plain
// baselines in one run and prints a table of tunnel/baseline ratios:
// small HTTP and HTTPS responses (HTTP/1.1 and HTTP/2), a large HTTPS
// download, gRPC unary and bidi latency, TCP bulk, round trips and new
// connections, interactive latency beside bulk data on one agent session,
// and the memory of idle agent sessions.
//
//	cd examples && go run ./bench/datapath
//	go run ./bench/datapath -rows http,bulk -duration 10s -runs 3
//	go run ./bench/datapath -rows http -cpuprofile /tmp/prof -memprofile /tmp/prof
//
// Every part runs in a process of its own, so that none shares a Go
// runtime with another and each one's CPU profile and CPU time is its own:
// the edge (the example edge's code, internal/edgecmd), the agent
// (agent.Client and package forward, as "tunnelkit agent" composes them), the
// app, the baselines' hops (an httputil.ReverseProxy, two plain TCP
// relays) and the Go load generators are this binary again, started in a
// role (examples/bench/internal/benchproc); wrk and h2load generate the
// HTTP load where they are installed. See README.md for what each row
// measures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

func main() {
	benchproc.Main("datapath", roles) // in a child: runs its role, and exits
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "datapath:", err)
		os.Exit(2)
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "datapath:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg, exe, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "datapath:", err)
		os.Exit(2)
	}
	if len(rep.failures) > 0 {
		os.Exit(1)
	}
}

// config is what a run measures, and how.
type config struct {
	Rows        []string      // the rows to run, in the order of rowTable
	Runs        int           // times each row runs; ratios are shown as min..max
	Duration    time.Duration // each timed load: HTTP, new connections
	Warmup      time.Duration // load before each measurement, unmeasured; 0: none
	Conns       int           // HTTP/1.1 connections (wrk -c)
	Threads     int           // wrk -t
	H2Conns     int           // h2load -c
	H2Streams   int           // h2load -m
	Download    int64         // bytes of the HTTPS download
	Bulk        int64         // bytes of the TCP echo
	RTTs        int           // 64-byte round trips of the rtt and interactive rows
	GRPCCalls   int           // unary calls
	PingPongs   int           // bidi ping-pongs on one stream
	ConnWorkers int           // concurrent clients of the new-connections row
	Sessions    int           // idle agent sessions
	CPUProfile  string        // directory for CPU profiles; empty: none
	MemProfile  string        // directory for allocation profiles; empty: none
	Logs        bool          // the edge's access log and the agent's request lines, as the example binaries write them
	GoLoad      bool          // the Go load generator even where wrk and h2load are installed
	GOMAXPROCS  int           // for every server process; 0: Go's default
	WorkDir     string        // certificates, logs and scripts; empty: a temporary directory
	Verbose     bool          // progress to Log
	Log         io.Writer     // where progress goes; nil: nowhere
}

func defaultConfig() *config {
	return &config{
		Runs:        1,
		Duration:    3 * time.Second,
		Warmup:      time.Second,
		Conns:       32,
		Threads:     2,
		H2Conns:     8,
		H2Streams:   16,
		Download:    1e9,
		Bulk:        256e6,
		RTTs:        5000,
		GRPCCalls:   2000,
		PingPongs:   1000,
		ConnWorkers: 8,
		Sessions:    2000,
		Logs:        true,
	}
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("datapath", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: datapath [flags]\n\nMeasures tunnelkit's data path against plain baselines, each tunnel row as a ratio\nto its baseline measured in the same run. Rows: %s.\n\n", strings.Join(rowNames(), ", "))
		fs.PrintDefaults()
	}
	rows := fs.String("rows", "all", "the rows to run, separated by commas: "+strings.Join(rowNames(), ",")+", or all")
	fs.IntVar(&cfg.Runs, "runs", cfg.Runs, "run every row this many times; ratios show as min..max, values as medians")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each timed load (HTTP rows, new connections); wrk rounds it up to whole seconds")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "unmeasured load before each timed measurement (count and size loads warm up with a tenth of theirs); 0: none")
	fs.IntVar(&cfg.Conns, "c", cfg.Conns, "HTTP/1.1 connections (wrk -c)")
	fs.IntVar(&cfg.Threads, "t", cfg.Threads, "wrk threads (wrk -t)")
	fs.IntVar(&cfg.H2Conns, "h2-conns", cfg.H2Conns, "HTTP/2 connections (h2load -c)")
	fs.IntVar(&cfg.H2Streams, "h2-streams", cfg.H2Streams, "concurrent streams per HTTP/2 connection (h2load -m)")
	fs.Var((*byteSize)(&cfg.Download), "download", "size of the HTTPS download (1GB, 64MB, 512KiB...)")
	fs.Var((*byteSize)(&cfg.Bulk), "bulk", "bytes of the TCP half-closed echo")
	fs.IntVar(&cfg.RTTs, "rtts", cfg.RTTs, "64-byte round trips measured on an open connection (rtt and interactive rows)")
	fs.IntVar(&cfg.GRPCCalls, "grpc-calls", cfg.GRPCCalls, "gRPC unary calls, one after another")
	fs.IntVar(&cfg.PingPongs, "grpc-pingpongs", cfg.PingPongs, "gRPC ping-pongs on one bidi stream")
	fs.IntVar(&cfg.ConnWorkers, "conn-workers", cfg.ConnWorkers, "concurrent clients of the new-connections row")
	fs.IntVar(&cfg.Sessions, "sessions", cfg.Sessions, "idle agent sessions at the edge (each costs the edge and the agents' process a descriptor)")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of each server process (edge, agent, app, baseline hops) per measurement into this directory, as CASE.PROCESS.cpu.pprof")
	fs.StringVar(&cfg.MemProfile, "memprofile", "", "write allocation profiles of each server process per measurement into this directory, as CASE.PROCESS.alloc.pprof (and .alloc-start.pprof, for -diff_base); the idle row's edge and agents write their heaps as mem-PID-N.heap.pprof and agents-PID-N.heap.pprof")
	fs.BoolVar(&cfg.Logs, "logs", cfg.Logs, "the edge's access log and the agent's line per request or connection, as the example binaries write them (to files in the work directory); false: warnings only")
	fs.BoolVar(&cfg.GoLoad, "go-load", false, "generate HTTP load with the Go generator even where wrk and h2load are installed")
	fs.IntVar(&cfg.GOMAXPROCS, "gomaxprocs", 0, "GOMAXPROCS of every server process (edge, agent, app, baseline hops); 0: Go's default")
	fs.StringVar(&cfg.WorkDir, "workdir", "", "directory for certificates, logs and scripts, kept (empty: a temporary one, removed unless a row failed)")
	fs.BoolVar(&cfg.Verbose, "v", false, "log progress to stderr")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if cfg.Rows, err = parseRows(*rows); err != nil {
		return nil, err
	}
	if cfg.Verbose {
		cfg.Log = stderr
	}
	return cfg, cfg.check()
}

// check rejects sizes that cannot run.
func (c *config) check() error {
	for _, v := range []struct {
		name string
		n    int64
	}{
		{"-runs", int64(c.Runs)}, {"-c", int64(c.Conns)}, {"-t", int64(c.Threads)}, {"-h2-conns", int64(c.H2Conns)},
		{"-h2-streams", int64(c.H2Streams)}, {"-download", c.Download}, {"-bulk", c.Bulk}, {"-rtts", int64(c.RTTs)},
		{"-grpc-calls", int64(c.GRPCCalls)}, {"-grpc-pingpongs", int64(c.PingPongs)}, {"-conn-workers", int64(c.ConnWorkers)},
	} {
		if v.n < 1 {
			return fmt.Errorf("%s %d: want 1 or more", v.name, v.n)
		}
	}
	if c.Sessions < 2 {
		return fmt.Errorf("-sessions %d: want 2 or more", c.Sessions)
	}
	if c.Duration <= 0 || c.Warmup < 0 {
		return errors.New("-duration: want more than 0; -warmup: want 0 or more")
	}
	return nil
}

// parseRows parses -rows.
func parseRows(s string) ([]string, error) {
	if s == "all" || s == "" {
		return rowNames(), nil
	}
	want := map[string]bool{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(rowNames(), f) {
			return nil, fmt.Errorf("-rows: %q is not a row (%s)", f, strings.Join(rowNames(), ", "))
		}
		want[f] = true
	}
	var rows []string
	for _, r := range rowNames() {
		if want[r] {
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// byteSize is a flag of bytes: 1GB (10^9), 256MB, 64KiB (2^16), 1000.
type byteSize int64

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"kB", 1e3}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.n
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || v < 0 {
		return fmt.Errorf("want a size such as 1GB, 64MiB or 4096")
	}
	*b = byteSize(v * float64(mult))
	return nil
}

// formatBytes writes n with the largest decimal unit it is a whole
// number of, or in bytes.
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KiB", 1 << 10}, {"KB", 1e3}} {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
