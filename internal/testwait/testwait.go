// Package testwait is how tunnelkit's tests wait: for a condition that
// another goroutine or process brings about (For, Within, Until), and for
// the goroutines a test started to end (NoLeak, Main). Each polls, and
// its time bound only ends a test that would fail anyway: a condition
// that holds returns at once, a slow machine only waits longer.
package testwait

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// DefaultBound is how long For waits.
const DefaultBound = 10 * time.Second

// poll is the pause between two looks at a condition.
const poll = 5 * time.Millisecond

// For waits until cond holds, and fails t if it still does not after
// DefaultBound.
func For(t testing.TB, cond func() bool) {
	t.Helper()
	Within(t, DefaultBound, "the condition held", cond)
}

// Within waits until cond holds, and fails t, saying what it waited for,
// if it still does not after bound.
func Within(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v, and still not: %s", bound, what)
		}
		time.Sleep(poll)
	}
}

// Until calls f until it returns nil, and fails t with f's last error if
// it still fails after bound.
func Until(t testing.TB, bound time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, bound, err)
		}
		time.Sleep(max(poll, bound/300))
	}
}

// NoLeak fails t if, once t and the cleanups registered after this call
// are done, more goroutines run than now, allowing slack more (goroutines
// of the runtime or of a shared server the test does not own). Call it
// first in a test; the test must not be parallel, since the count is the
// process's.
func NoLeak(t testing.TB, slack int) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		t.Helper()
		if n, ok := settle(before + slack); !ok {
			t.Errorf("%d goroutines left behind, want at most %d:\n%s", n, before+slack, stacks())
		}
	})
}

// Goroutines waits until at most max goroutines run in the process, and
// fails t with every goroutine's stack if more still run after the bound.
func Goroutines(t testing.TB, max int) {
	t.Helper()
	if n, ok := settle(max); !ok {
		t.Fatalf("%d goroutines left behind, want at most %d:\n%s", n, max, stacks())
	}
}

// Main runs the tests of m and fails the run when goroutines outlive them:
// every server, session and client a test starts must be closed and waited
// for by its cleanup. Use it as TestMain's body: os.Exit(testwait.Main(m)),
// with before, a func run after the tests and before the count (closing
// shared clients' idle connections, say), or nil.
func Main(m *testing.M, before func()) int {
	start := runtime.NumGoroutine()
	code := m.Run()
	if before != nil {
		before()
	}
	if n, ok := settle(start); code == 0 && !ok {
		fmt.Fprintf(os.Stderr, "%d goroutines outlived the tests (%d before):\n%s\n", n-start, start, stacks())
		code = 1
	}
	return code
}

// leakBound is how long NoLeak and Main wait for goroutines to end.
var leakBound = DefaultBound

// settle waits up to leakBound for at most max goroutines, and returns
// the last count.
func settle(max int) (int, bool) {
	deadline := time.Now().Add(leakBound)
	for {
		n := runtime.NumGoroutine()
		if n <= max {
			return n, true
		}
		if time.Now().After(deadline) {
			return n, false
		}
		time.Sleep(poll)
	}
}

func stacks() []byte {
	buf := make([]byte, 1<<20)
	return buf[:runtime.Stack(buf, true)]
}
