package wire

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"golang.ngrok.com/muxado/v2"
)

// TestLimitUnreadCutsStalledStreams: this side opens streams (as the edge
// opens one per public connection), and the peer fills the window of each
// while this side's readers read nothing, but for one live stream. The
// session holds its bound of unread bytes, not a window per stream: the
// stalled streams are cut, the oldest-stalled first, and the live one
// goes on.
func TestLimitUnreadCutsStalledStreams(t *testing.T) {
	client, server := sessionPair(t, false)
	var cuts atomic.Int32
	const max = 3 * MinWindow
	client.LimitUnread(max, func(*Stream) { cuts.Add(1) })

	accepted := acceptAll(server, 16)
	open := func() (*Stream, muxado.Stream) {
		t.Helper()
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("x")) // the SYN
		return st, <-accepted
	}
	live, livePeer := open()
	var liveRead atomic.Int64
	liveDone := make(chan struct{})
	go func() {
		n, _ := io.Copy(io.Discard, live)
		liveRead.Store(n)
		close(liveDone)
	}()
	const stalled = 8
	for range stalled {
		_, peer := open()
		go peer.Write(make([]byte, MinWindow)) // a window: all it may send unread
	}
	deadline := time.Now().Add(10 * time.Second)
	for client.unread.Load() > max || cuts.Load() < stalled-max/MinWindow {
		if time.Now().After(deadline) {
			t.Fatalf("unread %d bytes (bound %d), %d streams cut of %d stalled", client.unread.Load(), max, cuts.Load(), stalled)
		}
		time.Sleep(time.Millisecond)
	}
	// The live stream still carries bytes.
	if _, err := livePeer.Write(make([]byte, 4*MinWindow)); err != nil {
		t.Fatalf("the live stream broke: %v", err)
	}
	livePeer.Close()
	select {
	case <-liveDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the live stream's reader never saw its end")
	}
	if got := liveRead.Load(); got != 4*MinWindow {
		t.Fatalf("the live stream read %d bytes, want %d", got, 4*MinWindow)
	}
}

// TestLimitStalledCutsWaitingSenders: this side writes more than a window
// on streams whose peer reads nothing; past the bound, the streams that
// have waited for window the longest are cut (their writes fail), while a
// stream whose peer reads goes on.
func TestLimitStalledCutsWaitingSenders(t *testing.T) {
	client, server := sessionPair(t, false)
	var cuts atomic.Int32
	const max = 2
	client.LimitStalled(max, 50*time.Millisecond, func(*Stream) { cuts.Add(1) })
	accepted := acceptAll(server, 16)
	const stalled = 6
	failed := make(chan error, stalled)
	for range stalled {
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := st.Write(make([]byte, 2*MinWindow)) // past the window: it waits
			failed <- err
		}()
		<-accepted // the peer never reads it
	}
	live, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	live.Write([]byte("x"))
	livePeer := <-accepted
	go io.Copy(livePeer, livePeer) // an echo: it reads all it gets
	if _, err := io.ReadFull(live, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	for i := range stalled - max {
		select {
		case err := <-failed:
			if err == nil {
				t.Fatalf("a stalled write succeeded")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d stalled streams cut of the %d past the bound", i, stalled-max)
		}
	}
	// The live stream goes on: four windows of bytes, each half a window
	// at a time, echoed back before the next goes. It never waits for
	// window (the echo's frames bring the peer's grants before its
	// bytes), so it never counts as stalled, however loaded the machine.
	// (A stream that waits for window longer than the stall time counts,
	// and the cut takes the one that sent most: a live stream that sent
	// four windows in one write was cut, 1 run in about 150 under load.)
	half := make([]byte, MinWindow/2)
	for range 8 {
		if _, err := live.Write(half); err != nil {
			t.Fatalf("the live stream broke: %v", err)
		}
		if _, err := io.ReadFull(live, half); err != nil {
			t.Fatalf("the live stream's echo broke: %v", err)
		}
	}
	// A cut's callback runs after the stream is reset, so its writer may
	// fail before the callback counts it: wait for the count of the cuts
	// seen.
	testwait.For(t, func() bool { return cuts.Load() >= stalled-max })
	if got := cuts.Load(); got != stalled-max {
		t.Fatalf("%d cuts, want %d", got, stalled-max)
	}
}

// TestLimitStalledCutsWhatSentMost: of two stalled streams past the
// bound, the cut takes the one that sent more, though the other waited
// longer: a stream whose peer reads nothing has sent its window and holds
// more, while one that waits its turn with a short answer sent little.
func TestLimitStalledCutsWhatSentMost(t *testing.T) {
	client, server := sessionPair(t, false)
	cut := make(chan *Stream, 2)
	// Bounds that cut nothing until the streams are set up, then at once.
	client.LimitStalled(1, time.Hour, func(st *Stream) { cut <- st })
	accepted := acceptAll(server, 2)
	write := func(n int) (*Stream, muxado.Stream, chan error) {
		t.Helper()
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := st.Write(make([]byte, n)); done <- err }()
		return st, <-accepted, done
	}
	older, _, olderDone := write(2 * MinWindow) // sends its window, then waits
	newer, newerPeer, newerDone := write(3 * MinWindow)
	// The peer reads a window and a byte of the newer one, so it sent more
	// than the older one, and reads no more.
	if _, err := io.ReadFull(newerPeer, make([]byte, MinWindow+1)); err != nil {
		t.Fatal(err)
	}
	client.LimitStalled(1, time.Nanosecond, func(st *Stream) { cut <- st })
	if st := <-cut; st != newer {
		t.Fatalf("the cut took the stream that sent less (older %p, newer %p, cut %p)", older, newer, st)
	}
	if err := <-newerDone; err == nil {
		t.Fatal("the cut stream's write succeeded")
	}
	select {
	case err := <-olderDone:
		t.Fatalf("the older stream's write ended: %v", err)
	case st := <-cut:
		t.Fatalf("a second stream cut: %p", st)
	default:
	}
}

// acceptAll accepts the streams of s until it ends, each sent on the
// returned channel (room for room of them).
func acceptAll(s muxado.Session, room int) <-chan muxado.Stream {
	accepted := make(chan muxado.Stream, room)
	go func() {
		for {
			st, err := s.AcceptStream()
			if err != nil {
				return
			}
			accepted <- st
		}
	}()
	return accepted
}
