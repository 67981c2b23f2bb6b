package wire

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2/frame"
)

// TestFramerHoldsFramesBack drives the framer's hold by hand: a frame
// held back goes out with the next one written, in order and in one
// Write, or on flush, and no more than maxOut bytes wait.
func TestFramerHoldsFramesBack(t *testing.T) {
	small := payload(100)
	large := payload(copyLimit + 1)
	n := maxOut/(headerSize+len(small)) + 1 // frames: the last makes maxOut bytes held
	tests := []struct {
		name   string
		socket bool // the framer writes to a kernel socket (writev)
		run    func(t *testing.T, f *framer, more *bool)
		want   []frame.Frame
		tail   []byte // raw bytes after want's
		write  int    // Write calls
	}{{
		name: "held, then written with the next",
		run: func(t *testing.T, f *framer, more *bool) {
			write(t, f, packData(t, 1, small, false, true))
			write(t, f, packData(t, 3, small, false, true))
			*more = false
			write(t, f, packData(t, 5, small, true, false))
		},
		want:  []frame.Frame{packData(t, 1, small, false, true), packData(t, 3, small, false, true), packData(t, 5, small, true, false)},
		write: 1,
	}, {
		name: "held, then flushed",
		run: func(t *testing.T, f *framer, more *bool) {
			write(t, f, packData(t, 1, small, false, true))
			if err := f.flush(); err != nil {
				t.Fatal(err)
			}
			if err := f.flush(); err != nil { // nothing held: no Write
				t.Fatal(err)
			}
		},
		want:  []frame.Frame{packData(t, 1, small, false, true)},
		write: 1,
	}, {
		name: "held, then a reset injected after it",
		run: func(t *testing.T, f *framer, more *bool) {
			write(t, f, packData(t, 1, small, false, true))
			if err := f.inject(resetFrames(1)); err != nil {
				t.Fatal(err)
			}
		},
		want:  []frame.Frame{packData(t, 1, small, false, true)},
		tail:  resetFrames(1),
		write: 1,
	}, {
		name:   "held, then a large frame to a socket: one writev of two buffers",
		socket: true,
		run: func(t *testing.T, f *framer, more *bool) {
			write(t, f, packData(t, 1, small, false, true))
			write(t, f, packData(t, 3, large, false, true))
		},
		want:  []frame.Frame{packData(t, 1, small, false, true), packData(t, 3, large, false, true)},
		write: 2, // the recorder takes net.Buffers a buffer at a time
	}, {
		name: "held, then a large frame to another writer: copied, one Write",
		run: func(t *testing.T, f *framer, more *bool) {
			write(t, f, packData(t, 1, small, false, true))
			*more = false
			write(t, f, packData(t, 3, large, false, true))
		},
		want:  []frame.Frame{packData(t, 1, small, false, true), packData(t, 3, large, false, true)},
		write: 1,
	}, {
		name: "held, then a GOAWAY",
		run: func(t *testing.T, f *framer, more *bool) {
			write(t, f, packData(t, 1, small, false, true))
			write(t, f, packGoAway(t, 1, 0, nil))
		},
		want:  []frame.Frame{packData(t, 1, small, false, true), packGoAway(t, 1, 0, nil)},
		write: 3, // the stock framer writes a GOAWAY's header and body apart
	}, {
		name: "no more than maxOut held",
		run: func(t *testing.T, f *framer, more *bool) {
			for i := range n {
				write(t, f, packData(t, frame.StreamId(2*i+1), small, false, true))
			}
		},
		want: func() []frame.Frame {
			var fs []frame.Frame
			for i := range n {
				fs = append(fs, packData(t, frame.StreamId(2*i+1), small, false, true))
			}
			return fs
		}(),
		write: 1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec recorder
			f := newFramer(bytes.NewReader(nil), &rec, windowHold)
			f.writev = tt.socket
			more := true
			f.s = holdHooks{&more}
			tt.run(t, f, &more)
			if len(rec.writes) != tt.write {
				t.Errorf("%d Writes, want %d", len(rec.writes), tt.write)
			}
			if got, want := rec.all(), append(stockBytes(t, tt.want...), tt.tail...); !bytes.Equal(got, want) {
				t.Errorf("wrote %x..., want %x...", head(got), head(want))
			}
			if f.out != nil {
				t.Errorf("%d bytes still held", len(*f.out))
			}
		})
	}
}

func write(t *testing.T, f *framer, fr frame.Frame) {
	t.Helper()
	if err := f.WriteFrame(fr); err != nil {
		t.Fatal(err)
	}
}

// writeCounter counts its Writes, each of which takes delay more.
type writeCounter struct {
	net.Conn
	writes atomic.Int64
	delay  time.Duration
}

func (c *writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	time.Sleep(c.delay)
	return c.Conn.Write(p)
}

// TestSessionWritesFramesTogether has 64 streams of one session send
// small messages at once over a connection whose every Write takes 100 µs
// (a busy socket), and checks that each arrives whole, in order, and that
// the session wrote fewer times than it sent frames: the frames that
// queued behind a Write went together in the next. No frame waits for
// good: every write returns once the peer read it.
func TestSessionWritesFramesTogether(t *testing.T) {
	t.Parallel()
	a, b := tcpPair(t)
	ca := &writeCounter{Conn: a, delay: 100 * time.Microsecond}
	client := NewSession(ca, DefaultWindow, true, 0)
	server := NewSession(b, DefaultWindow, false, 0)
	t.Cleanup(func() { client.Close(); server.Close() })

	const streams, messages = 64, 50
	msg := func(s, m int) []byte { return fmt.Appendf(nil, "stream %d message %d;", s, m) }
	var frames atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*streams)
	for s := range streams {
		wg.Go(func() {
			st, err := client.OpenStream()
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			for m := range messages {
				if _, err := st.Write(msg(s, m)); err != nil {
					errs <- err
					return
				}
				frames.Add(1)
			}
		})
		wg.Go(func() {
			st, err := server.AcceptStream()
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			got, err := io.ReadAll(st)
			if err != nil {
				errs <- err
				return
			}
			var n int
			if _, err := fmt.Sscanf(string(got), "stream %d message 0;", &n); err != nil {
				errs <- fmt.Errorf("got %.40q: %v", got, err)
				return
			}
			var want []byte
			for m := range messages {
				want = append(want, msg(n, m)...)
			}
			if !bytes.Equal(got, want) {
				errs <- fmt.Errorf("stream %d: got %.60q..., want %.60q...", n, got, want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	w, f := ca.writes.Load(), frames.Load()
	t.Logf("%d frames of data in %d writes (with the preamble, window updates and FINs)", f, w)
	if w >= f {
		t.Errorf("%d writes for %d frames of data: none written together", w, f)
	}
}

// TestHeldFrameWrittenWhenTheNextOneFails holds a stream's frame back
// because another stream's frame is counted on its way, and then has that
// one fail (its writer counts it out, as when muxado fails the write
// before the framer saw it): the held frame must reach the peer then.
func TestHeldFrameWrittenWhenTheNextOneFails(t *testing.T) {
	t.Parallel()
	a, b := tcpPair(t)
	client := NewSession(a, DefaultWindow, true, 0)
	server := NewSession(b, DefaultWindow, false, 0)
	t.Cleanup(func() { client.Close(); server.Close() })

	other, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	// other's frame is on its way, as far as the framer knows.
	other.queued.Store(true)
	client.queued.Add(1)

	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Stream, 1)
	go func() {
		s, err := server.AcceptStream()
		if err != nil {
			t.Error(err)
		}
		accepted <- s
	}()
	select {
	case <-accepted:
		t.Fatal("the frame went out while another was counted on its way")
	case <-time.After(100 * time.Millisecond):
	}
	client.unqueue(other) // other's write failed: the held frame goes now
	var s *Stream
	select {
	case s = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the held frame never went out")
	}
	if s == nil {
		return
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "held" {
		t.Fatalf("read %q, %v; want held", buf, err)
	}
}

// TestSessionHold keeps a session's held window updates well below its
// window, for every window a preamble may set.
func TestSessionHold(t *testing.T) {
	for _, w := range []uint32{MinWindow, DefaultWindow, MaxWindow} {
		if h := sessionHold(w); h == 0 || h > w/4 {
			t.Errorf("window %d: hold %d, want (0, %d]", w, h, w/4)
		}
	}
}

// holdHooks are a framer's hooks that hold each frame while *more is
// set, and do nothing else: the framer reads as NewFramer's does.
type holdHooks struct{ more *bool }

func (h holdHooks) hold(uint32, bool) bool        { return *h.more }
func (holdHooks) peerReset(uint32)                {}
func (holdHooks) ended()                          {}
func (holdHooks) received(uint32, int)            {}
func (holdHooks) granted(uint32, uint32)          {}
func (holdHooks) opened()                         {}
func (holdHooks) refused(uint32, frame.ErrorCode) {}
func (holdHooks) goneAway()                       {}
func (holdHooks) take(uint32, bool, bool, int, io.Reader, int) (bool, error) {
	return false, nil
}
