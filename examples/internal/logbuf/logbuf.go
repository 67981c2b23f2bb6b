// Package logbuf batches a program's log lines, so that a line per
// request costs an append rather than a write to the terminal or file:
// the lines go out together once Delay passed since the first of them,
// when many are waiting, or on Flush and Close. A line is written whole
// and lines keep their order; a process that dies at once loses what
// waits, at most Delay of lines.
package logbuf

import (
	"io"
	"sync"
	"time"
)

// maxWaiting is the most bytes of lines that wait: past it, a write
// flushes them.
const maxWaiting = 64 << 10

// Writer batches the writes to W. Its zero value is not usable: use New.
type Writer struct {
	w     io.Writer
	delay time.Duration

	mu     sync.Mutex
	buf    []byte
	timer  *time.Timer // runs Flush once the first waiting write is delay old
	closed bool
	err    error // the first error of W, returned by the writes after it
}

// New returns a Writer to w that holds a line at most delay.
func New(w io.Writer, delay time.Duration) *Writer {
	return &Writer{w: w, delay: delay}
}

// Write queues p, which is one or more whole lines (as slog's handlers
// write them). After Close it writes p through at once.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if b.closed {
		return b.w.Write(p)
	}
	b.buf = append(b.buf, p...)
	switch {
	case len(b.buf) >= maxWaiting:
		b.flushLocked()
	case b.timer == nil:
		b.timer = time.AfterFunc(b.delay, func() { b.Flush() })
	}
	return len(p), nil
}

// Flush writes the waiting lines.
func (b *Writer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	return b.err
}

func (b *Writer) flushLocked() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if len(b.buf) == 0 || b.err != nil {
		b.buf = b.buf[:0]
		return
	}
	_, b.err = b.w.Write(b.buf)
	if cap(b.buf) > 4*maxWaiting {
		b.buf = nil // a burst's buffer is not kept
	} else {
		b.buf = b.buf[:0]
	}
}

// Close writes the waiting lines; later writes go through at once.
func (b *Writer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	b.closed = true
	return b.err
}
