package router

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

func collect[B comparable](t *Table[B], name string) []B {
	return slices.Collect(t.Backends(name))
}

func TestExactAndWildcard(t *testing.T) {
	var tb Table[string]
	must(t, tb.Add("app.example.test", "exact"))
	must(t, tb.Add("*.example.test", "wild"))
	must(t, tb.Add("*.deep.example.test", "deepwild"))

	cases := []struct {
		name, want, pattern string
	}{
		{"app.example.test", "exact", "app.example.test"},
		{"APP.Example.TEST", "exact", "app.example.test"},
		{"app.example.test.", "exact", "app.example.test"},
		{"other.example.test", "wild", "*.example.test"},
		{"a.b.example.test", "wild", "*.example.test"},
		{"x.deep.example.test", "deepwild", "*.deep.example.test"},
		{"deep.example.test", "wild", "*.example.test"},
		{"example.test", "", ""},
		{"app.example.org", "", ""},
		{"", "", ""},
		{"bad name.example.test", "", ""},
		{"app.example.test..", "", ""},
	}
	for _, c := range cases {
		got, ok := tb.Next(c.name)
		if c.want == "" {
			if ok {
				t.Errorf("Next(%q) = %q, want no route", c.name, got)
			}
			if tb.Has(c.name) {
				t.Errorf("Has(%q) = true", c.name)
			}
			continue
		}
		if !ok || got != c.want {
			t.Errorf("Next(%q) = %q, %v; want %q", c.name, got, ok, c.want)
		}
		if p, _ := tb.Match(c.name); p != c.pattern {
			t.Errorf("Match(%q) = %q, want %q", c.name, p, c.pattern)
		}
	}
}

func TestInvalidNames(t *testing.T) {
	var tb Table[int]
	for _, n := range []string{"", "*", "*.", "a..b", "a b", "a/b", "*.*.x", "x.*.y", "-", "-a.test", "a-.test", "a.test-", string(make([]byte, 300)), "a\r\nb",
		"toolonglabel-toolonglabel-toolonglabel-toolonglabel-toolonglabel.x"} {
		if err := tb.Add(n, 1); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Add(%q) = %v, want ErrInvalidName", n, err)
		}
	}
	if len(tb.Names()) != 0 {
		t.Fatalf("names after invalid adds: %v", tb.Names())
	}
}

func TestRoundRobin(t *testing.T) {
	var tb Table[string]
	for _, b := range []string{"a", "b", "c"} {
		must(t, tb.Add("x.test", b))
	}
	must(t, tb.Add("x.test", "a")) // duplicate: no effect
	counts := map[string]int{}
	for range 300 {
		b, _ := tb.Next("x.test")
		counts[b]++
	}
	for _, b := range []string{"a", "b", "c"} {
		if counts[b] != 100 {
			t.Fatalf("round robin counts = %v, want 100 each", counts)
		}
	}
	// Every call yields all backends, each once, starting at a rotating point.
	seq := collect(&tb, "x.test")
	if len(seq) != 3 {
		t.Fatalf("Backends = %v", seq)
	}
	slices.Sort(seq)
	if !slices.Equal(seq, []string{"a", "b", "c"}) {
		t.Fatalf("Backends sorted = %v", seq)
	}
}

func TestFailoverAndCooldown(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := Table[string]{Cooldown: time.Minute, now: func() time.Time { return now }}
	must(t, tb.Add("x.test", "a"))
	must(t, tb.Add("x.test", "b"))
	must(t, tb.Add("other.test", "a"))

	tb.Fail("a")
	for range 10 {
		seq := collect(&tb, "x.test")
		if !slices.Equal(seq, []string{"b", "a"}) {
			t.Fatalf("with a failed, Backends = %v, want [b a] (a last resort)", seq)
		}
	}
	// Health is per backend, shared across names: a is still the only
	// choice for other.test, so it is yielded as a last resort.
	if got := collect(&tb, "other.test"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("other.test = %v", got)
	}

	now = now.Add(time.Minute + time.Second)
	seen := map[string]bool{}
	for range 4 {
		b, _ := tb.Next("x.test")
		seen[b] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("after cooldown, a not tried again: %v", seen)
	}

	tb.Fail("b")
	tb.Succeed("b")
	seen = map[string]bool{}
	for range 4 {
		b, _ := tb.Next("x.test")
		seen[b] = true
	}
	if !seen["b"] {
		t.Fatal("Succeed did not end the cooldown")
	}
}

// TestCooldownDoubles: a backend that fails again each time its cooldown
// ends is skipped twice as long each time, up to MaxCooldownFactor times
// the Cooldown; a Succeed starts over.
func TestCooldownDoubles(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := Table[string]{Cooldown: time.Second, now: func() time.Time { return now }}
	must(t, tb.Add("x.test", "a"))
	must(t, tb.Add("x.test", "b"))
	skipped := func() time.Duration { // how long a is skipped for, to the second
		start := now
		// Two lookups in a row start at each member in turn, unless a
		// is skipped: then both start at b.
		skips := func() bool {
			first := collect(&tb, "x.test")[0]
			second := collect(&tb, "x.test")[0]
			return first == "b" && second == "b"
		}
		for skips() {
			now = now.Add(time.Second)
		}
		d := now.Sub(start)
		return d
	}
	for i, want := range []time.Duration{1, 2, 4, 8, 16, 32, 32} {
		tb.Fail("a")
		if got := skipped(); got != want*time.Second {
			t.Fatalf("after %d failures in a row, a was skipped %v, want %v", i+1, got, want*time.Second)
		}
	}
	tb.Succeed("a")
	tb.Fail("a")
	if got := skipped(); got != time.Second {
		t.Fatalf("after a Succeed, a failure skips a %v, want 1s", got)
	}

	// Failures during a cooldown, of requests under way when it began,
	// neither lengthen it nor double the next: one outage, one failure.
	tb.Succeed("a")
	tb.Fail("a")
	for range 1000 {
		tb.Fail("a")
	}
	if got := skipped(); got != time.Second {
		t.Fatalf("1,001 failures within one cooldown skip a %v, want 1s", got)
	}
	tb.Fail("a")
	if got := skipped(); got != 2*time.Second {
		t.Fatalf("the next failure after them skips a %v, want 2s", got)
	}
}

func TestCooldownDisabled(t *testing.T) {
	tb := Table[string]{Cooldown: -1}
	must(t, tb.Add("x.test", "a"))
	must(t, tb.Add("x.test", "b"))
	tb.Fail("a")
	seen := map[string]int{}
	for range 4 {
		b, _ := tb.Next("x.test")
		seen[b]++
	}
	if seen["a"] != 2 {
		t.Fatalf("negative cooldown still skipped a: %v", seen)
	}
}

func TestFailoverLoop(t *testing.T) {
	// The documented loop: dial failures are reported and the next backend
	// is taken from the same sequence.
	var tb Table[string]
	for _, b := range []string{"dead1", "live", "dead2"} {
		must(t, tb.Add("x.test", b))
	}
	dial := func(b string) error {
		if b != "live" {
			return errors.New("refused")
		}
		return nil
	}
	for range 20 {
		var got string
		for b := range tb.Backends("x.test") {
			if dial(b) != nil {
				tb.Fail(b)
				continue
			}
			got = b
			break
		}
		if got != "live" {
			t.Fatalf("failover did not reach the live backend")
		}
	}
	// Once both dead ones are in cooldown, the live one comes first.
	if b, _ := tb.Next("x.test"); b != "live" {
		t.Fatalf("Next = %q, want live first while the others cool down", b)
	}
}

func TestRemove(t *testing.T) {
	var tb Table[string]
	must(t, tb.Add("x.test", "a"))
	must(t, tb.Add("x.test", "b"))
	must(t, tb.Add("*.y.test", "a"))
	if !tb.Remove("X.TEST", "a") {
		t.Fatal("Remove returned false")
	}
	if tb.Remove("x.test", "a") {
		t.Fatal("second Remove returned true")
	}
	if got := collect(&tb, "x.test"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("after Remove = %v", got)
	}
	if !tb.Remove("x.test", "b") || tb.Has("x.test") {
		t.Fatal("empty pool not removed")
	}
	if n := tb.RemoveBackend("a"); n != 1 {
		t.Fatalf("RemoveBackend = %d, want 1", n)
	}
	if tb.Has("z.y.test") || len(tb.Names()) != 0 {
		t.Fatalf("names left: %v", tb.Names())
	}
	if n := tb.RemoveBackend("a"); n != 0 {
		t.Fatalf("RemoveBackend again = %d", n)
	}
}

func TestRemoveBackendAcrossNames(t *testing.T) {
	var tb Table[int]
	for i := range 5 {
		must(t, tb.Add(fmt.Sprintf("n%d.test", i), 7))
		must(t, tb.Add(fmt.Sprintf("n%d.test", i), 8))
	}
	if n := tb.RemoveBackend(7); n != 5 {
		t.Fatalf("RemoveBackend = %d", n)
	}
	for i := range 5 {
		if got := tb.Pool(fmt.Sprintf("n%d.test", i)); !slices.Equal(got, []int{8}) {
			t.Fatalf("pool %d = %v", i, got)
		}
	}
	if !slices.Equal(tb.Names(), []string{"n0.test", "n1.test", "n2.test", "n3.test", "n4.test"}) {
		t.Fatalf("Names = %v", tb.Names())
	}
}

func TestZeroValueEmpty(t *testing.T) {
	var tb Table[string]
	if tb.Has("x.test") || len(collect(&tb, "x.test")) != 0 || tb.Remove("x.test", "a") || tb.RemoveBackend("a") != 0 {
		t.Fatal("zero table is not empty")
	}
	tb.Fail("a")
	tb.Succeed("a")
}

func TestConcurrent(t *testing.T) {
	var tb Table[int]
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		writers.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("n%d.test", i%10)
				_ = tb.Add(name, w)
				tb.Fail(w)
				tb.Remove(name, w)
			}
		})
	}
	for range 4 {
		readers.Go(func() {
			for i := range 20000 {
				for b := range tb.Backends(fmt.Sprintf("n%d.test", i%10)) {
					if b < 0 || b > 3 {
						t.Errorf("backend %d", b)
					}
				}
			}
		})
	}
	readers.Wait()
	close(stop)
	writers.Wait()
}

func TestNextDoesNotAllocate(t *testing.T) {
	tb := tableOf(t, 1000)
	must(t, tb.Add("*.example.test", "wild"))
	for _, name := range []string{"app500.example.test", "a.b.example.test", "app.example.org"} {
		if n := testing.AllocsPerRun(100, func() { tb.Next(name) }); n != 0 {
			t.Errorf("Next(%q) allocates %v times", name, n)
		}
	}
}

func TestConcurrentRemoveBackend(t *testing.T) {
	// Sessions bind exact names and wildcards and are torn down whole while
	// readers look up names. Readers must see each pool whole: no backend
	// twice, none that was never added, a pattern that is one of the names.
	patterns := []string{"a.x.test", "b.x.test", "*.x.test", "*.y.x.test"}
	var tb Table[int]
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		writers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, p := range patterns {
					_ = tb.Add(p, w)
				}
				tb.Fail(w)
				if n := tb.RemoveBackend(w); n != len(patterns) {
					t.Errorf("RemoveBackend(%d) = %d, want %d", w, n, len(patterns))
					return
				}
			}
		})
	}
	for range 4 {
		readers.Go(func() {
			for i := range 20000 {
				name := []string{"a.x.test", "z.y.x.test", "q.x.test", "b.x.test"}[i%4]
				seen := map[int]bool{}
				for b := range tb.Backends(name) {
					if b < 0 || b > 3 || seen[b] {
						t.Errorf("Backends(%q) yielded %d (seen %v)", name, b, seen)
						return
					}
					seen[b] = true
				}
				if p, ok := tb.Match(name); ok && !slices.Contains(patterns, p) {
					t.Errorf("Match(%q) = %q", name, p)
					return
				}
				if i%1000 == 0 {
					if names := tb.Names(); len(names) > len(patterns) || !slices.IsSorted(names) {
						t.Errorf("Names = %v", names)
						return
					}
				}
			}
		})
	}
	readers.Wait()
	close(stop)
	writers.Wait()
	if names := tb.Names(); len(names) != 0 {
		t.Fatalf("names left: %v", names)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func BenchmarkLookupExact(b *testing.B) {
	var tb Table[string]
	for i := range 1000 {
		_ = tb.Add(fmt.Sprintf("app%d.example.test", i), "127.0.0.1:1")
		_ = tb.Add(fmt.Sprintf("app%d.example.test", i), "127.0.0.1:2")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := tb.Next("app500.example.test"); !ok {
				b.Fatal("miss")
			}
		}
	})
}

func BenchmarkLookupWildcard(b *testing.B) {
	var tb Table[string]
	_ = tb.Add("*.example.test", "127.0.0.1:1")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := tb.Next("a.b.example.test"); !ok {
				b.Fatal("miss")
			}
		}
	})
}

// tableOf returns a table of n names, each bound to the same backend, as an
// edge holds the names of one agent session.
func tableOf(tb testing.TB, n int) *Table[string] {
	tb.Helper()
	t := new(Table[string])
	for i := range n {
		if err := t.Add(fmt.Sprintf("app%d.example.test", i), "session"); err != nil {
			tb.Fatal(err)
		}
	}
	return t
}

// addRemove binds one more name to the table's backend and unbinds it.
func addRemove(t *Table[string]) {
	_ = t.Add("new.example.test", "session")
	t.Remove("new.example.test", "session")
}

// bytesPerRun is testing.AllocsPerRun for bytes: the average number of bytes
// allocated by one call of f.
func bytesPerRun(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f() // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// TestWriteCostIndependentOfSize checks that a write does not copy the table:
// binding and unbinding one name allocates about as much in a table of 10,000
// names as in one of 10. A write that cloned the table would allocate in
// proportion to its size.
func TestWriteCostIndependentOfSize(t *testing.T) {
	small, large := tableOf(t, 10), tableOf(t, 10_000)
	bSmall := bytesPerRun(1000, func() { addRemove(small) })
	bLarge := bytesPerRun(1000, func() { addRemove(large) })
	t.Logf("bytes per Add+Remove: %.0f with 10 names, %.0f with 10,000", bSmall, bLarge)
	if bLarge > 2*bSmall+512 {
		t.Fatalf("Add+Remove allocates %.0f bytes with 10,000 names, %.0f with 10: writes grow with the table", bLarge, bSmall)
	}
}

// BenchmarkAddRemoveScaling reports the cost of one Add+Remove on a table of
// 10,000 names relative to one of 10 as the metric "ratio"; it is about 1
// when writes do not depend on the size of the table.
func BenchmarkAddRemoveScaling(b *testing.B) {
	small, large := tableOf(b, 10), tableOf(b, 10_000)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		addRemove(small)
	}
	mid := time.Now()
	for range b.N {
		addRemove(large)
	}
	end := time.Now()
	dSmall, dLarge := mid.Sub(start), end.Sub(mid)
	b.ReportMetric(float64(dSmall.Nanoseconds())/float64(b.N), "ns/op-10")
	b.ReportMetric(float64(dLarge.Nanoseconds())/float64(b.N), "ns/op-10000")
	b.ReportMetric(float64(dLarge)/float64(dSmall), "ratio")
}
