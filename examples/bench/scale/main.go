//go:build unix

// Command scale measures a cluster of edges holding many agents, on one
// machine (issue #43). It starts etcd (Debian's etcd-server), -edges
// edges as `tunnelkit edge` processes sharing their routes through it,
// each with agent TLS, relays to the others, tickets and an admin port,
// and one more edge that holds no agent (the observer: what the route
// cache alone costs). Then agent processes, each holding many real
// agent.Client sessions over TLS with one HTTP endpoint apiece, their
// edges in an order of their own; and it sends public requests to random
// names through random edges, as a load balancer would, so that most are
// relayed. It goes through these phases, each of which must complete or
// the run fails:
//
//  1. baseline: -baseline agents bound, and -load of -rate requests/s to
//     their names;
//  2. bind: the other agents started at once; the seconds until every one
//     is bound;
//  3. idle: -settle, then each edge's heap and goroutines (after a GC, from
//     -pprof) against before the bind, and the CPU of the edges and etcd
//     over -idle, from /proc;
//  4. load: -load of -rate requests/s to every name;
//  5. kill: kill -9 of the first edge under load; how long its agents take
//     to be bound again elsewhere, with the same URL, and the requests
//     that failed meanwhile, to their names and to the others';
//  6. rolling: each edge in turn stopped with SIGTERM (it drains) and
//     started again, under load; the failed requests, and every agent
//     bound at the end.
//
// It prints a table and, with -json, writes it as JSON. With -check it
// exits 1 unless every agent was bound, kept its URL, and no request
// failed but those to the killed edge's names (the CI-sized run).
//
//	go run ./bench/scale -edges 10 -agents 100000 -json scale.json
//	go run ./bench/scale -edges 3 -agents 3000 -idle 10s -load 5s -check
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// domain is the edges' domain: agent i's endpoint is http://a<i>.example.test.
const domain = "example.test"

// config is the run's flags.
type config struct {
	edges, agents, baseline, perProcess, workers, rate, agentNice                                 int
	load, idle, settle, bindTimeout, rebindTimeout                                                time.Duration
	drainTimeout, heartbeat                                                                       time.Duration
	etcdTTL                                                                                       time.Duration
	jsonPath, workdir, tunnelkit, etcd, agentLog, edgeLog, edgeGOGC, agentGOGC, edgeMem, agentMem string
	kill, rolling, check                                                                          bool
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.IntVar(&c.edges, "edges", 10, "edges of the cluster (and one observer edge that holds no agent)")
	fs.IntVar(&c.agents, "agents", 100_000, "agents, each one agent.Client with one HTTP endpoint")
	fs.IntVar(&c.baseline, "baseline", 100, "agents of the baseline load, bound first")
	fs.IntVar(&c.perProcess, "per-process", 12_500, "agents per agent process (each holds a file descriptor per agent)")
	fs.IntVar(&c.workers, "workers", 32, "agents binding at once in each agent process")
	fs.IntVar(&c.rate, "rate", 1000, "public requests a second, to random names through random edges")
	fs.DurationVar(&c.load, "load", 20*time.Second, "length of each measured load")
	fs.DurationVar(&c.idle, "idle", 60*time.Second, "length of the idle CPU measurement")
	fs.DurationVar(&c.settle, "settle", 10*time.Second, "wait after the bind before the idle measurement")
	fs.DurationVar(&c.bindTimeout, "bind-timeout", 10*time.Minute, "the bind phase fails past this")
	fs.DurationVar(&c.rebindTimeout, "rebind-timeout", time.Minute, "the kill and rolling phases fail when agents are not bound again within this")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "each edge's -drain-timeout")
	fs.DurationVar(&c.heartbeat, "heartbeat", 0, "the heartbeat interval of the agents and the edges (-heartbeat-interval; 0: their default)")
	fs.DurationVar(&c.etcdTTL, "etcd-ttl", 0, "each edge's -etcd-ttl (0: its default)")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.StringVar(&c.workdir, "workdir", "", "directory for certificates, etcd's data and every process's log, kept (empty: a temporary one, removed)")
	fs.StringVar(&c.tunnelkit, "tunnelkit", "", "the tunnelkit binary (empty: go build it from this module)")
	fs.StringVar(&c.etcd, "etcd", "etcd", "the etcd binary")
	fs.StringVar(&c.edgeGOGC, "edge-gogc", "400", "GOGC of the edges' processes (empty: Go's default, 100): an edge of 10,000 sessions and 100,000 routes holds some 350 MB, which a GC cycle at every 100% of growth scans over and over while agents bind")
	fs.StringVar(&c.agentGOGC, "agent-gogc", "400", "GOGC of the agent processes, each of which stands for thousands of devices of an agent each (empty: Go's default)")
	fs.StringVar(&c.edgeMem, "edge-memlimit", "1GiB", "GOMEMLIMIT of the edges' processes (empty: none): with -edge-gogc 400 alone, 11 edges' heaps grew to 5 times their 355 MB while agents moved, and the machine ran out of memory")
	fs.StringVar(&c.agentMem, "agent-memlimit", "800MiB", "GOMEMLIMIT of the agent processes (empty: none)")
	fs.IntVar(&c.agentNice, "agent-nice", 0, "niceness of the agent processes, which stand for devices elsewhere: on one machine they take the CPU that the edges, etcd and the load leave (0: the harness's own)")
	fs.StringVar(&c.edgeLog, "edge-log-level", "warn", "each edge's -log-level (its log is in the work directory)")
	fs.StringVar(&c.agentLog, "agent-log-level", "error", "the least level of the lines the agents log, into their processes' logs in the work directory")
	fs.BoolVar(&c.kill, "kill", true, "run the kill phase")
	fs.BoolVar(&c.rolling, "rolling", true, "run the rolling restart")
	fs.BoolVar(&c.check, "check", false, "exit 1 unless every agent was bound and kept its URL and no request failed but those the kill phase allows")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.edges < 2:
		return c, fmt.Errorf("-edges %d: a cluster has 2 at least", c.edges)
	case c.baseline < 1 || c.baseline >= c.agents:
		return c, fmt.Errorf("-agents %d, -baseline %d: want 1 <= baseline < agents (the bind phase starts the others)", c.agents, c.baseline)
	case c.perProcess < 1 || c.workers < 1 || c.rate < 1:
		return c, fmt.Errorf("-per-process, -workers and -rate must be positive")
	case c.load <= 0 || c.idle <= 0:
		return c, fmt.Errorf("-load and -idle must be positive")
	}
	return c, nil
}

func main() {
	benchproc.Main("scale", map[string]benchproc.Role{"agents": agentsRole})
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if err != flag.ErrHelp {
			fmt.Fprintln(os.Stderr, "scale:", err)
		}
		os.Exit(2)
	}
	raiseFileLimit()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stderr)
	if res != nil {
		printTable(os.Stdout, res)
		if cfg.jsonPath != "" {
			b, werr := json.MarshalIndent(res, "", "  ")
			if werr == nil {
				werr = os.WriteFile(cfg.jsonPath, append(b, '\n'), 0o644)
			}
			if werr != nil {
				fmt.Fprintln(os.Stderr, "scale: -json:", werr)
				os.Exit(1)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale: FAILED:", err)
		os.Exit(1)
	}
	if cfg.check && len(res.Failures) > 0 {
		for _, f := range res.Failures {
			fmt.Fprintln(os.Stderr, "scale: check failed:", f)
		}
		os.Exit(1)
	}
}

// raiseFileLimit lifts this process's soft limit of file descriptors to
// its hard one: the processes it starts inherit it.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
