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
	failed := stallWrites(t, client, accepted, stalled)
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
	// and the cut takes the one that holds most: a live stream that wrote
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

// TestStalledTimerLetGoWhenIdle: once no write is under way and the
// stall check ran, a session holds no timer for it; the next stalled
// writes are still cut past the bound.
func TestStalledTimerLetGoWhenIdle(t *testing.T) {
	client, server := sessionPair(t, false)
	var cuts atomic.Int32
	client.LimitStalled(1, 20*time.Millisecond, func(*Stream) { cuts.Add(1) })
	accepted := acceptAll(server, 16)
	timer := func() *time.Timer {
		client.stalled.mu.Lock()
		defer client.stalled.mu.Unlock()
		return client.stalled.timer
	}
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	<-accepted
	if timer() == nil {
		t.Fatal("no timer after a write")
	}
	testwait.Within(t, 10*time.Second, "the stall timer let go", func() bool { return timer() == nil })

	failed := stallWrites(t, client, accepted, 2)
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("a stalled write succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stalled stream cut past the bound, after the timer was let go")
	}
	testwait.For(t, func() bool { return cuts.Load() >= 1 })
}

// TestLimitStalledCutsWhatHoldsMost: of two stalled streams past the
// bound, the cut takes the one that holds more (its window in flight and
// the rest of its write), though the other waited longer and sent far
// more over its life: a long download whose client paused is not cut
// ahead of a stream stalled with more behind it.
func TestLimitStalledCutsWhatHoldsMost(t *testing.T) {
	client, server := sessionPair(t, false)
	cut := make(chan *Stream, 2)
	// Bounds that cut nothing until the streams are set up, then at once.
	client.LimitStalled(1, time.Hour, func(st *Stream) { cut <- st })
	accepted := acceptAll(server, 2)
	open := func() (*Stream, muxado.Stream) {
		t.Helper()
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		peer := <-accepted
		if _, err := io.ReadFull(peer, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		return st, peer
	}
	write := func(st *Stream, n int) chan error {
		done := make(chan error, 1)
		go func() { _, err := st.Write(make([]byte, n)); done <- err }()
		return done
	}

	// The veteran sends 16 windows, all read, then writes a window and a
	// half to a peer that reads no more: its window in flight, and half a
	// window to go.
	veteran, vpeer := open()
	go io.CopyN(io.Discard, vpeer, 16*MinWindow)
	if _, err := veteran.Write(make([]byte, 16*MinWindow)); err != nil {
		t.Fatal(err)
	}
	veteranDone := write(veteran, MinWindow+MinWindow/2)
	waitWriting(t, veteran)

	// The hoarder writes four windows to a peer that reads nothing.
	hoarder, _ := open()
	hoarderDone := write(hoarder, 4*MinWindow)
	inFlight := func(st *Stream) int64 { return st.sent.Load() - st.granted.Load() }
	testwait.For(t, func() bool { // both wait for window, all of it in flight
		return inFlight(veteran) == MinWindow && inFlight(hoarder) == MinWindow
	})
	// The veteran holds about a window and a half (and the grants its
	// peer holds back, under a quarter window), the hoarder four windows;
	// the veteran has sent over 17 windows, the hoarder one.

	client.LimitStalled(1, time.Nanosecond, func(st *Stream) { cut <- st })
	if st := <-cut; st != hoarder {
		t.Fatalf("the cut took the stream that holds less (veteran %p, hoarder %p, cut %p)", veteran, hoarder, st)
	}
	if err := <-hoarderDone; err == nil {
		t.Fatal("the cut stream's write succeeded")
	}
	select {
	case err := <-veteranDone:
		t.Fatalf("the veteran's write ended: %v", err)
	case st := <-cut:
		t.Fatalf("a second stream cut: %p", st)
	default:
	}
}

// acceptAll accepts the streams of s until it ends, each sent on the
// returned channel (room for room of them).
// stallWrites opens n streams of s, each writing more than a window that
// the peer, which accepts them on accepted, never reads; each Write's
// error comes on the channel returned once the write ends.
func stallWrites(t *testing.T, s *Session, accepted <-chan muxado.Stream, n int) <-chan error {
	t.Helper()
	failed := make(chan error, n)
	for range n {
		st, err := s.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := st.Write(make([]byte, 2*MinWindow)) // past the window: it waits
			failed <- err
		}()
		<-accepted // the peer never reads it
	}
	return failed
}

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
