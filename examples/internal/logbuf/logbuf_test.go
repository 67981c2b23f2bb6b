package logbuf

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the timer's flush.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	n  int // writes
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	return l.b.Write(p)
}

func (l *lockedBuffer) get() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String(), l.n
}

// TestLinesArriveWholeInOrder logs from many goroutines through slog: every
// line arrives once, whole, each goroutine's in order, in fewer writes
// than lines.
func TestLinesArriveWholeInOrder(t *testing.T) {
	out := &lockedBuffer{}
	w := New(out, time.Hour) // only the size bound and Close flush
	log := slog.New(slog.NewTextHandler(w, nil))
	const goroutines, lines = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range lines {
				log.Info("http", "g", g, "i", i, "path", strings.Repeat("x", i%50))
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, writes := out.get()
	next := make([]int, goroutines)
	n := 0
	for line := range strings.Lines(got) {
		g, i := -1, -1
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "g="); ok {
				g, _ = strconv.Atoi(v)
			}
			if v, ok := strings.CutPrefix(f, "i="); ok {
				i, _ = strconv.Atoi(v)
			}
		}
		if g < 0 || g >= goroutines || i < 0 || !strings.HasSuffix(line, "\n") {
			t.Fatalf("a broken line %q", line)
		}
		if i != next[g] {
			t.Fatalf("goroutine %d: line %d after %d", g, i, next[g]-1)
		}
		next[g]++
		n++
	}
	if n != goroutines*lines {
		t.Fatalf("%d lines, want %d", n, goroutines*lines)
	}
	if writes >= n/10 {
		t.Errorf("%d writes for %d lines: not batched", writes, n)
	}
	// After Close, a line goes through at once.
	log.Info("late")
	if got, _ := out.get(); !strings.HasSuffix(got, "msg=late\n") {
		t.Errorf("a line after Close did not go through: %q", got[max(0, len(got)-40):])
	}
}

// TestALoneLineGoesOutAfterTheDelay: a single line waits for the delay,
// then goes out without a Flush.
func TestALoneLineGoesOutAfterTheDelay(t *testing.T) {
	out := &lockedBuffer{}
	w := New(out, 10*time.Millisecond)
	defer w.Close()
	w.Write([]byte("one line\n"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := out.get(); got == "one line\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the line never went out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
