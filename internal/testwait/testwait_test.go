package testwait

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records a failure instead of ending the
// test, so that the helpers' failures can be tested.
type recorder struct {
	testing.TB
	failed   atomic.Bool
	msg      atomic.Value
	cleanups []func()
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed.Store(true)
	r.msg.Store(format)
	panic(r) // as Fatalf's Goexit would, end the helper
}
func (r *recorder) Errorf(format string, args ...any) { r.failed.Store(true); r.msg.Store(format) }
func (r *recorder) Cleanup(f func())                  { r.cleanups = append(r.cleanups, f) }

// run calls f with r, catching the recorder's own panic.
func (r *recorder) run(f func(testing.TB)) {
	defer func() {
		if v := recover(); v != nil && v != r {
			panic(v)
		}
	}()
	f(r)
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestWithin(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			time.Sleep(time.Millisecond)
			n.Add(1)
		}
	}()
	For(t, func() bool { return n.Load() == 3 })

	r := &recorder{TB: t}
	r.run(func(tb testing.TB) { Within(tb, 20*time.Millisecond, "never", func() bool { return false }) })
	if !r.failed.Load() {
		t.Fatal("a condition that never holds did not fail the test")
	}
}

func TestUntil(t *testing.T) {
	calls := 0
	Until(t, time.Second, "third time", func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) {
		Until(tb, 20*time.Millisecond, "never", func() error { return errors.New("no") })
	})
	if !r.failed.Load() {
		t.Fatal("a call that always fails did not fail the test")
	}
}

func TestNoLeak(t *testing.T) {
	// A goroutine that ends with the test's cleanup: no leak.
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) {
		NoLeak(tb, 0)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { <-stop; close(done) }()
		tb.Cleanup(func() { close(stop); <-done })
	})
	if r.failed.Load() {
		t.Fatal("a goroutine that ended was taken for a leak")
	}

	// Two that outlive it: a leak, even if a goroutine of an earlier
	// test ends meanwhile. (They end after the check.)
	r = &recorder{TB: t}
	stop := make(chan struct{})
	defer close(stop)
	leakBound = 50 * time.Millisecond
	defer func() { leakBound = DefaultBound }()
	r.run(func(tb testing.TB) {
		NoLeak(tb, 0)
		go func() { <-stop }()
		go func() { <-stop }()
	})
	if !r.failed.Load() {
		t.Fatal("a goroutine left running was not reported")
	}
}
