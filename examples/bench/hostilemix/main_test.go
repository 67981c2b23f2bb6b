package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// TestMain lets the test binary serve as the edge child too
// (benchproc.Main): the tests start the binary they run in, so that
// nothing is compiled under a test's deadline.
func TestMain(m *testing.M) {
	benchproc.Main("hostilemix.test", roles)
	os.Exit(m.Run())
}

// TestHostileMix runs the whole benchmark, both phases and every attack,
// with 1 s phases and small attacks: the well-behaved client must see no
// failure.
func TestHostileMix(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the edge for two phases")
	}
	cfg := defaultConfig()
	cfg.Duration = time.Second
	cfg.Ramp = 300 * time.Millisecond
	// Small attacks: well within the race detector's 8128 goroutines.
	cfg.HelloLoops, cfg.PreHelloConns, cfg.PreHelloStreams = 1, 4, 256
	cfg.FloodConcurrency, cfg.HalfClose, cfg.BadChunked = 8, 2, 2
	cfg.SlowBodies, cfg.IdleTCP, cfg.Upgrades = 60, 60, 10
	cfg.TrickleEvery = time.Second
	cfg.Verbose = testing.Verbose()
	cfg.Log = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	t.Logf("report:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Phases) != 2 {
		t.Fatalf("%d phases, want 2", len(res.Phases))
	}
	if n := res.failures(); n > 0 {
		t.Fatalf("the well-behaved client had %d failures", n)
	}
	q, h := res.Phases[0], res.Phases[1]
	if q.Good.HTTP.N == 0 || h.Good.HTTP.N == 0 || q.Good.TCP.N == 0 || h.Good.TCP.N == 0 {
		t.Fatalf("the well-behaved client did nothing in a phase: quiet %+v, hostile %+v", q.Good, h.Good)
	}
	if q.Edge.HWM == 0 || h.Edge.HWM == 0 {
		t.Fatal("the edge's peak RSS was not measured")
	}
	if len(h.Attacks) != len(attackNames) {
		t.Fatalf("%d attacks ran, want %d", len(h.Attacks), len(attackNames))
	}
	for _, a := range h.Attacks {
		if len(a.t.m) == 0 {
			t.Errorf("attack %d (%s) counted nothing", a.n, attackNames[a.n-1])
		}
	}
	if !strings.Contains(out.String(), "hostile/quiet") {
		t.Error("the report has no ratios")
	}
}

func TestParseAttacks(t *testing.T) {
	if set, err := parseAttacks("all"); err != nil || set != nil {
		t.Fatalf("all: %v %v", set, err)
	}
	set, err := parseAttacks("1, 10")
	if err != nil || len(set) != 2 || !set[1] || !set[10] {
		t.Fatalf("1, 10: %v %v", set, err)
	}
	for _, bad := range []string{"0", "11", "x", "1,,2"} {
		if _, err := parseAttacks(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestField(t *testing.T) {
	line := `time=2025-01-01T00:00:00.000Z level=INFO msg="http error" status=429 code=client_limit host=app.example.test`
	for k, want := range map[string]string{"level": "INFO", "msg": "http error", "status": "429", "code": "client_limit", "nope": ""} {
		if got := field(line, k); got != want {
			t.Errorf("field %s: %q, want %q", k, got, want)
		}
	}
}

// testWriter logs progress lines to t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
