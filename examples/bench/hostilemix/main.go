// Command hostilemix checks that an edge under many attacks at once still
// serves a well-behaved client of the attacked endpoint without a single
// failure, and measures what the attacks cost that client and the edge.
//
//	cd examples && go run ./bench/hostilemix -duration 20s
//
// It runs the example edge (the code of "tunnelkit edge", package edgecmd, less its etcd and
// metrics flags) as a child process, its own executable started again as
// the edge, a fresh one for each of two phases, so that its memory is
// measured alone: a quiet phase, where only the well-behaved client runs,
// then a hostile one, where ten attacks run beside it. The program plays
// the load balancer in front of the edge (-proxy-protocol-from 127.0.0.1/32):
// every public connection it makes starts with a PROXY v1 header naming its
// client.
// Attackers come from 198.51.100.0/24, a few addresses per attack; the
// well-behaved client comes from 203.0.113.5.
//
// In its own process it runs the app (net/http, behind forward.Bytes), an
// echo server and the agent, which binds http://app and a tcp:// endpoint.
//
// The attacks are sized so that this process holds about 8000 descriptors
// at most: each connection an attack holds open through the agent costs it
// three (the attacker's, the agent's to the app, the app's), so 1250 slow
// bodies, 1250 idle TCP connections and 200 upgrades come to about 8300.
// -slow, -idle, -upgrades and -scale change the sizes (the descriptor limit
// is per process; the edge child has its own).
//
// It prints a table: per phase the well-behaved client's requests,
// failures, p50, p99 and max latency, and the edge's peak RSS; the
// hostile/quiet latency ratios; and a line per attack saying what it did
// and what the edge answered. It exits 1 when the well-behaved client had
// any failure in either phase, 2 when the benchmark itself could not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

func main() {
	benchproc.Main("hostilemix", roles) // in the edge child: runs it, and exits
	cfg := defaultConfig()
	fs := flag.NewFlagSet("hostilemix", flag.ExitOnError)
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the well-behaved client runs in each phase")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "the well-behaved client's HTTP workers, each on its own keep-alive connection")
	fs.DurationVar(&cfg.Pace, "pace", cfg.Pace, "each worker starts a request this often (0: back to back, which alone saturates a small machine)")
	fs.BoolVar(&cfg.Verbose, "v", false, "log progress to stderr")
	attacks := fs.String("attacks", "all", "the attacks of the hostile phase: \"all\", or numbers such as 1,2,10")
	fs.IntVar(&cfg.AddrsPerAttack, "addrs", cfg.AddrsPerAttack, "client addresses each public attack comes from")
	scale := fs.Float64("scale", 1, "multiply the sizes of the attacks (connections held, concurrency) by this")
	fs.IntVar(&cfg.SlowBodies, "slow", cfg.SlowBodies, "connections of attack 4 (slow bodies), before -scale; each costs this process 3 descriptors")
	fs.IntVar(&cfg.IdleTCP, "idle", cfg.IdleTCP, "connections of attack 5 (idle TCP), before -scale; each costs this process 3 descriptors")
	fs.IntVar(&cfg.Upgrades, "upgrades", cfg.Upgrades, "connections of attack 9 (idle upgrades), before -scale")
	fs.IntVar(&cfg.IdleBurst, "idle-burst", 0, "bytes each idle TCP connection of attack 5 sends and reads back before it idles")
	fs.StringVar(&cfg.LogDir, "logs", "", "directory for the edge's logs, kept (empty: a temporary one, kept only when the client failed)")
	fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hostilemix: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	set, err := parseAttacks(*attacks)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostilemix:", err)
		os.Exit(2)
	}
	cfg.Attacks = set
	cfg.scale(*scale)
	if cfg.Verbose {
		cfg.Log = os.Stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostilemix:", err)
		os.Exit(2)
	}
	if res.failures() > 0 {
		os.Exit(1)
	}
}

// config is what a run does. The zero values of the sizes mean none of
// that attack's connections.
type config struct {
	Duration time.Duration // the well-behaved client's time in each phase
	Workers  int           // its HTTP workers
	Pace     time.Duration // each worker's time from one request's start to the next; 0: back to back
	Verbose  bool          // progress lines to Log
	Log      io.Writer     // where progress goes; nil: nowhere
	LogDir   string        // where the edge's logs go; empty: a temporary directory
	Attacks  map[int]bool  // the attacks to run; nil: all

	// Ramp is how long the attacks run before the well-behaved client
	// starts in the hostile phase.
	Ramp time.Duration

	// AddrsPerAttack is how many client addresses each public attack uses.
	AddrsPerAttack int

	HelloLoops       int           // 1: goroutines sending two hellos per session
	PreHelloConns    int           // 2: sessions at once opening streams before a hello
	PreHelloStreams  int           // 2: streams each of them opens at most
	FloodConcurrency int           // 3: requests at once, each on a new connection
	SlowBodies       int           // 4: connections trickling a request body
	TrickleEvery     time.Duration // 4: the wait between two trickles
	IdleTCP          int           // 5: idle connections to the TCP endpoint
	IdleBurst        int           // 5: bytes each sends, and reads back, before it idles
	HalfClose        int           // 7: half-closing requests at once
	BadChunked       int           // 8: malformed chunked requests at once
	Upgrades         int           // 9: upgraded connections held idle
	MaxBinds         int           // 10: binds tried at most, in case no bound stops them
}

func defaultConfig() *config {
	c := &config{
		Duration:         20 * time.Second,
		Workers:          4,
		Pace:             10 * time.Millisecond,
		Ramp:             2 * time.Second,
		AddrsPerAttack:   4,
		HelloLoops:       2,
		PreHelloConns:    32,
		PreHelloStreams:  4096,
		FloodConcurrency: 50,
		SlowBodies:       1250,
		TrickleEvery:     3 * time.Second,
		IdleTCP:          1250,
		HalfClose:        4,
		BadChunked:       4,
		Upgrades:         200,
		MaxBinds:         5000,
	}
	if raceEnabled {
		// The race detector allows 8128 goroutines per process.
		c.scale(0.1)
	}
	return c
}

// scale multiplies the sizes of the attacks by f, keeping each at least 1.
func (c *config) scale(f float64) {
	if f == 1 {
		return
	}
	for _, n := range []*int{&c.HelloLoops, &c.PreHelloConns, &c.PreHelloStreams, &c.FloodConcurrency,
		&c.SlowBodies, &c.IdleTCP, &c.HalfClose, &c.BadChunked, &c.Upgrades} {
		*n = max(1, int(float64(*n)*f))
	}
}

// enabled reports whether attack n runs.
func (c *config) enabled(n int) bool { return c.Attacks == nil || c.Attacks[n] }

func (c *config) logf(format string, args ...any) {
	if c.Verbose && c.Log != nil {
		fmt.Fprintf(c.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// parseAttacks parses the -attacks flag.
func parseAttacks(s string) (map[int]bool, error) {
	if s == "all" || s == "" {
		return nil, nil
	}
	set := map[int]bool{}
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > len(attackNames) {
			return nil, fmt.Errorf("-attacks: %q is not an attack number (1-%d)", f, len(attackNames))
		}
		set[n] = true
	}
	return set, nil
}
