package wire

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// grants runs acquire for each of frames (a stream and a size) in its own
// goroutine, one after another as each starts to wait, while all slots
// are held; then releases slots one by one and returns the frames in the
// order they were granted.
func grants(t *testing.T, s *scheduler, frames []schedFrame) []int {
	t.Helper()
	for range sendSlots {
		s.acquire(&Stream{}, 1) // the slots are taken
	}
	order := make(chan int, len(frames))
	var wg sync.WaitGroup
	for i, f := range frames {
		wg.Go(func() {
			s.acquire(f.st, f.size)
			order <- i
		})
		testwait.For(t, func() bool { // in line before the next arrives
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.waiting) == i+1
		})
	}
	var got []int
	for range frames {
		s.release()
		got = append(got, <-order)
	}
	wg.Wait()
	return got
}

type schedFrame struct {
	st   *Stream
	size int
}

// TestSchedulerPutsAQuietStreamFirst: a hundred streams wait with full
// frames, each having sent much already; a quiet stream's small frame,
// arriving last, is granted first.
func TestSchedulerPutsAQuietStreamFirst(t *testing.T) {
	s := &scheduler{}
	var frames []schedFrame
	for range 100 {
		st := &Stream{}
		s.mu.Lock()
		st.finish = s.now + 10*MaxFrameData // it has been sending
		s.mu.Unlock()
		frames = append(frames, schedFrame{st, MaxFrameData})
	}
	frames = append(frames, schedFrame{&Stream{}, 100})
	got := grants(t, s, frames)
	if got[0] != 100 {
		t.Fatalf("the quiet stream's frame was granted %dth: order %v", indexOf(got, 100)+1, got[:10])
	}
}

// TestSchedulerSharesBytes: two streams send back to back, one in full
// frames and one in quarter frames: each gets its share of bytes, not of
// frames; arrivals of equal finish go in order.
func TestSchedulerSharesBytes(t *testing.T) {
	s := &scheduler{}
	big, small := &Stream{}, &Stream{}
	var frames []schedFrame
	for range 4 {
		frames = append(frames, schedFrame{big, MaxFrameData})
	}
	for range 16 {
		frames = append(frames, schedFrame{small, MaxFrameData / 4})
	}
	got := grants(t, s, frames)
	// In every prefix of the order, the two streams' bytes differ by a
	// frame at most.
	var bigBytes, smallBytes int
	for _, i := range got {
		if i < 4 {
			bigBytes += MaxFrameData
		} else {
			smallBytes += MaxFrameData / 4
		}
		if d := bigBytes - smallBytes; d > MaxFrameData || d < -MaxFrameData {
			t.Fatalf("after %v: %d bytes of the big frames' stream, %d of the small ones'", got, bigBytes, smallBytes)
		}
	}
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestWritesTakeTurnsOverASession runs a session over loopback TCP where
// many streams write more than a window to a peer that never reads them,
// and one stream echoes small messages: every echo comes back (no write
// waits behind the stalled streams' for a slot), and the stalled writers
// hold no slot (each waits for window).
func TestWritesTakeTurnsOverASession(t *testing.T) {
	a, b := tcpPair(t)
	client := NewSession(a, MinWindow, true, 0)
	server := NewSession(b, MinWindow, false, 1024)
	t.Cleanup(func() { client.Close(); server.Close() })
	accepted := make(chan *Stream, 1024)
	go func() {
		for {
			st, err := server.AcceptStream()
			if err != nil {
				return
			}
			accepted <- st
		}
	}()
	const stalled = 200
	for range stalled {
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		go st.Write(make([]byte, 2*MinWindow)) // past the window: it waits, holding no slot
	}
	for range stalled {
		<-accepted // never read
	}
	echo, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	echo.Write([]byte("?"))
	peer := <-accepted
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := peer.Read(buf)
			if err != nil {
				return
			}
			peer.Write(buf[:n])
		}
	}()
	buf := make([]byte, 64)
	if _, err := echo.Read(buf[:1]); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		echo.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := echo.Write(buf[:64]); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
		if _, err := io.ReadFull(echo, buf[:64]); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	client.sched.mu.Lock()
	used := client.sched.used
	client.sched.mu.Unlock()
	if used != 0 {
		t.Errorf("%d slots held while every writer waits for window", used)
	}
}
