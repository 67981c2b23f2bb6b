package wire

import (
	"bytes"
	"io"
	"runtime"
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
