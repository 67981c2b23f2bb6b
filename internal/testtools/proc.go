package testtools

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proc is an outside command run for one test. Its output (stdout and
// stderr together) is kept, and logged when the test failed; the command
// is killed at the test's cleanup, or, on Linux, when the test binary dies
// without running it.
type Proc struct {
	name string
	cmd  *exec.Cmd
	out  outputBuffer
	done chan struct{} // closed once the command has exited
	err  error         // Wait's error, set before done is closed
	once sync.Once
}

// Start runs the command name with args in dir. It fails the test when
// the command cannot start.
func Start(t testing.TB, dir, name string, args ...string) *Proc {
	t.Helper()
	p := &Proc{name: name, done: make(chan struct{})}
	p.out.changed = make(chan struct{})
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout = &p.out
	cmd.Stderr = &p.out
	cmd.WaitDelay = 5 * time.Second
	killWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("--- %s (pid %d) output:\n%s", name, cmd.Process.Pid, p.Output())
		}
	})
	return p
}

// WaitOutput waits until the command's output holds s. It fails when the
// command exits first, or ctx ends.
func (p *Proc) WaitOutput(ctx context.Context, s string) error {
	for {
		out, changed := p.out.snapshot()
		if strings.Contains(out, s) {
			return nil
		}
		select {
		case <-changed:
		case <-p.done:
			if out, _ := p.out.snapshot(); strings.Contains(out, s) {
				return nil
			}
			return fmt.Errorf("%s exited (%v) before printing %q", p.name, p.err, s)
		case <-ctx.Done():
			return fmt.Errorf("%s did not print %q: %w", p.name, s, context.Cause(ctx))
		}
	}
}

// Output returns the command's output so far.
func (p *Proc) Output() string {
	out, _ := p.out.snapshot()
	return out
}

// Done is closed once the command has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop kills the command and waits for it to exit. It may be called more
// than once.
func (p *Proc) Stop() {
	p.once.Do(func() { p.cmd.Process.Kill() })
	<-p.done
}

// outputBuffer keeps a command's output and tells waiters when it grows.
type outputBuffer struct {
	mu      sync.Mutex
	b       strings.Builder
	changed chan struct{} // closed and replaced at each write
}

func (o *outputBuffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.b.Write(p)
	close(o.changed)
	o.changed = make(chan struct{})
	return len(p), nil
}

// snapshot returns the output so far, and a channel closed at the next
// write.
func (o *outputBuffer) snapshot() (string, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String(), o.changed
}
