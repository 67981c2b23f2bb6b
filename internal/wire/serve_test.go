package wire

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// accepting tells whether a goroutine runs Session.accept.
func accepting() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Contains(buf, []byte("wire.(*Session).accept("))
}

// openWriting opens a stream of peer's and writes b on it.
func openWriting(t *testing.T, peer muxado.Session, b []byte) muxado.Stream {
	t.Helper()
	st, err := peer.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(b); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestServeHandsStreamsInOrder: the streams the peer opens, before Serve
// and after, reach handle one at a time, in the order they were opened;
// once none is left, no goroutine waits to accept the next (a loop around
// AcceptStream would), and the next stream starts one again. done runs
// once the session ended.
func TestServeHandsStreamsInOrder(t *testing.T) {
	client, server := sessionPair(t, false)
	peer := server     // the stock side opens, the Session serves
	for i := range 3 { // before Serve
		openWriting(t, peer, []byte{byte(i)})
	}
	got := make(chan byte, 16)
	inHandle := make(chan struct{}, 1)
	done := make(chan struct{})
	client.Serve(func(st *Stream) {
		select {
		case inHandle <- struct{}{}:
		default:
			t.Error("two handles ran at once")
		}
		var b [1]byte
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(st, b[:]); err != nil {
			t.Error(err)
		}
		got <- b[0]
		<-inHandle
	}, func() { close(done) })
	for i := range 3 {
		if b := <-got; b != byte(i) {
			t.Fatalf("stream %d handed as %d", b, i)
		}
	}
	testwait.For(t, func() bool { return !accepting() })

	for i := 3; i < 8; i++ {
		openWriting(t, peer, []byte{byte(i)})
	}
	for i := 3; i < 8; i++ {
		if b := <-got; b != byte(i) {
			t.Fatalf("stream %d handed as %d", b, i)
		}
	}
	testwait.For(t, func() bool { return !accepting() })
	select {
	case <-done:
		t.Fatal("done ran while the session was open")
	default:
	}
	peer.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("done never ran after the session ended")
	}
}

// TestServeDoneWaitsForHandle: done runs only once the handle under way
// returned, though the session ended meanwhile.
func TestServeDoneWaitsForHandle(t *testing.T) {
	client, server := sessionPair(t, false)
	release := make(chan struct{})
	handling := make(chan struct{})
	done := make(chan struct{})
	client.Serve(func(*Stream) {
		close(handling)
		<-release
	}, func() { close(done) })
	openWriting(t, server, []byte("x"))
	<-handling
	client.Close()
	select {
	case <-done:
		t.Fatal("done ran before the handle under way returned")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("done never ran")
	}
}

// TestServeAfterTheEnd: Serve on a session that already ended runs done.
func TestServeAfterTheEnd(t *testing.T) {
	client, _ := sessionPair(t, false)
	client.Close()
	done := make(chan struct{})
	client.Serve(func(*Stream) { t.Error("a stream handed after the end") }, func() { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("done never ran")
	}
}

// servePair is a Session with an accept queue of backlog streams, on
// loopback TCP, and the Session of its peer, which opens the streams.
func servePair(t *testing.T, backlog uint32) (s, peer *Session) {
	t.Helper()
	a, b := tcpPair(t)
	s, peer = NewSession(a, MinWindow, true, backlog), NewSession(b, MinWindow, false, 0)
	t.Cleanup(func() { s.Close(); peer.Close() })
	return s, peer
}

// readerWaits tells whether a session's reader waits for room in its
// accept queue.
func readerWaits() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Contains(buf, []byte("wire.(*Session).opened("))
}

// echoed opens a stream of peer's, writes a byte and reads it back.
func echoed(peer *Session, b byte) error {
	st, err := peer.OpenStream()
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Write([]byte{b}); err != nil {
		return err
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got [1]byte
	if _, err := io.ReadFull(st, got[:]); err != nil {
		return err
	}
	if got[0] != b {
		return fmt.Errorf("echo %d, want %d", got[0], b)
	}
	return nil
}

// echo serves a stream: it reads a byte and writes it back.
func echo(st *Stream) {
	defer st.Close()
	var b [1]byte
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(st, b[:]); err == nil {
		st.Write(b[:])
	}
}

// TestServeBurstWaitsForHandle: a burst of streams far past the accept
// queue, while handle is held up: the session stops reading until handle
// catches up, and every stream is served, none reset (muxado resets those
// past its queue after a millisecond).
func TestServeBurstWaitsForHandle(t *testing.T) {
	s, peer := servePair(t, 2)
	gate := make(chan struct{})
	var once sync.Once
	s.Serve(func(st *Stream) {
		once.Do(func() { <-gate })
		go echo(st)
	}, nil)
	const n = 50
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- echoed(peer, byte(i)) }()
	}
	testwait.Within(t, 10*time.Second, "the reader waits for room in the accept queue", readerWaits)
	close(gate)
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestServeCloseWhileTheReaderWaits: Close ends a session whose reader
// waits for room in the accept queue, behind a handle that never returns;
// done runs once it does.
func TestServeCloseWhileTheReaderWaits(t *testing.T) {
	s, peer := servePair(t, 2)
	release := make(chan struct{})
	done := make(chan struct{})
	s.Serve(func(st *Stream) { <-release }, func() { close(done) })
	for i := range 6 {
		go echoed(peer, byte(i))
	}
	testwait.Within(t, 10*time.Second, "the reader waits for room in the accept queue", readerWaits)
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close never returned while the reader waited")
	}
	select {
	case <-done:
		t.Fatal("done ran before the handle under way returned")
	default:
	}
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("done never ran")
	}
}

// TestServeStreamsResetBeforeServeDoNotCount: streams muxado reset before
// Serve (its queue was full) are not counted as waiting to be accepted:
// the streams after Serve are served.
func TestServeStreamsResetBeforeServeDoNotCount(t *testing.T) {
	s, peer := servePair(t, 2)
	const before = 6
	errs := make(chan error, before)
	for i := range before {
		go func() { errs <- echoed(peer, byte(i)) }()
	}
	// Two wait in the queue for Serve; muxado resets the others.
	for range before - 2 {
		if err := <-errs; err == nil {
			t.Fatal("a stream past the queue was served before Serve")
		}
	}
	s.Serve(func(st *Stream) { go echo(st) }, nil)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a stream queued before Serve: %v", err)
		}
	}
	for i := range 10 {
		if err := echoed(peer, byte(i)); err != nil {
			t.Fatalf("stream %d after Serve: %v", i, err)
		}
	}
}
