//go:build unix

package benchproc

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
)

// logSink keeps a child's log in a file: its first headMax bytes, then,
// when the child goes on (an access line per request adds up to hundreds
// of megabytes in a long run), its last logTail bytes and how much was
// left out between them (Options.LogHead).
type logSink struct {
	headMax int64

	mu      sync.Mutex
	f       *os.File
	head    int64  // bytes written to f
	tailBuf []byte // the last bytes past the head, at most logTail
	skipped int64  // bytes past the head no longer in tailBuf
	closed  bool
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	if l.closed {
		return n, nil
	}
	if k := min(int64(len(p)), l.headMax-l.head); k > 0 {
		l.f.Write(p[:k])
		l.head += k
		p = p[k:]
	}
	l.tailBuf = append(l.tailBuf, p...)
	if over := len(l.tailBuf) - logTail; over > 0 {
		l.skipped += int64(over)
		l.tailBuf = append(l.tailBuf[:0], l.tailBuf[over:]...)
	}
	return n, nil
}

// Close writes the tail to the file and closes it.
func (l *logSink) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.skipped > 0 {
		fmt.Fprintf(l.f, "\n[... %d bytes of log left out ...]\n", l.skipped)
	}
	l.f.Write(l.tailBuf)
	return l.f.Close()
}

// tail returns the end of the log: the tail kept, or the file when the
// tail is empty or written out.
func (l *logSink) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tailBuf
	if len(b) == 0 || l.closed {
		b, _ = os.ReadFile(l.f.Name())
	}
	return string(b)
}

// WatchFor returns a writer that passes what it is given on to w, and a
// channel closed once a whole line containing s went through it: a role
// that runs a server whose log says when it listens ("edge up") is ready
// then.
func WatchFor(w io.Writer, s string) (io.Writer, <-chan struct{}) {
	l := &lineWatcher{w: w, s: []byte(s), seen: make(chan struct{})}
	return l, l.seen
}

type lineWatcher struct {
	w    io.Writer
	s    []byte
	seen chan struct{}

	mu    sync.Mutex
	line  []byte // the line being written, until s is seen
	found bool
}

func (l *lineWatcher) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.found {
		l.line = append(l.line, p...)
		for {
			i := bytes.IndexByte(l.line, '\n')
			if i < 0 {
				break
			}
			if bytes.Contains(l.line[:i], l.s) {
				l.found = true
				close(l.seen)
				l.line = nil
				break
			}
			l.line = l.line[i+1:]
		}
	}
	return l.w.Write(p)
}
