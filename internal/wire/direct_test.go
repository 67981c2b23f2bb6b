package wire

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// Frames written from the writer's goroutine (Stream.write): tests of what
// a peer sees, and of what muxado's writer still does.

// TestStreamWritesReachAStockPeer: streams opened at either end carry
// writes of every size (within a frame, across frames, an empty one) to a
// stock muxado peer, each opened stream's SYN sent once, with its first
// frame: a second SYN is a protocol error that ends the peer's session,
// and a frame without one is answered with a reset. Each stream's FIN
// follows its data; a write after CloseWrite fails, and sends nothing
// that harms the session.
func TestStreamWritesReachAStockPeer(t *testing.T) {
	client, server := sessionPair(t, true)
	writes := [][]byte{
		[]byte("first"),
		nil,
		payload(3*MaxFrameData + 17), // frames within the window as the peer reads
		[]byte("last"),
	}
	var want []byte
	for _, w := range writes {
		want = append(want, w...)
	}
	for i := range 3 { // streams after the first: the session lives on
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		wrote := make(chan error, 1)
		go func() {
			for _, w := range writes {
				if _, err := st.Write(w); err != nil {
					wrote <- err
					return
				}
			}
			wrote <- st.CloseWrite()
		}()
		peer := acceptStream(t, server)
		peer.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(peer)
		if err != nil {
			t.Fatalf("stream %d: the peer read %d bytes, then %v", i, len(got), err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("stream %d: the peer read %d bytes, not the %d written", i, len(got), len(want))
		}
		if err := <-wrote; err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if _, err := st.Write([]byte("after FIN")); err == nil {
			t.Fatalf("stream %d: a write after CloseWrite succeeded", i)
		}

		// The peer's stream: this end accepted it, and answers on it.
		ps, err := server.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ps.Write([]byte("ask")); err != nil {
			t.Fatal(err)
		}
		in, err := client.AcceptStream()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			in.Write([]byte("answer"))
			in.Write(payload(MaxFrameData + 1))
			in.CloseWrite()
		}()
		ps.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err = io.ReadAll(ps)
		if err != nil {
			t.Fatalf("stream %d: the peer read %d bytes of the answer, then %v", i, len(got), err)
		}
		if wantAnswer := append([]byte("answer"), payload(MaxFrameData+1)...); !bytes.Equal(got, wantAnswer) {
			t.Fatalf("stream %d: the peer read %d bytes of the answer, not %d", i, len(got), len(wantAnswer))
		}
		st.Close()
		in.Close()
		ps.Close()
		peer.Close()
	}
}

// TestWriteDeadlineOverAStalledConn: the session's connection is stalled
// (its peer reads nothing). A write with a deadline fails once it passed:
// it goes through muxado's writer, which bounds its wait; a frame written
// from the writer's goroutine would wait in the socket for ever. Session
// Close then ends a write without a deadline that waits in the socket.
func TestWriteDeadlineOverAStalledConn(t *testing.T) {
	a, b := net.Pipe() // b is never read: the first frame's write blocks
	defer b.Close()
	client := NewSession(a, DefaultWindow, true, 0)
	defer client.Close()

	blocked, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan error, 1)
	go func() {
		_, err := blocked.Write([]byte("never read"))
		stuck <- err
	}()
	waitWriting(t, blocked)

	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	wrote := make(chan error, 1)
	go func() {
		_, err := st.Write([]byte("bounded"))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if code, _ := muxado.GetError(err); code != muxado.WriteTimeout {
			t.Fatalf("a write over a stalled connection returned %v, want muxado's write timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write with a deadline waited past it")
	}

	closed := make(chan struct{})
	go func() {
		client.Close()
		close(closed)
	}()
	select {
	case err := <-stuck:
		if err == nil {
			t.Fatal("the write stalled in the socket succeeded after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a write stalled in the socket")
	}
	<-closed
}

// TestTurnsAreInOrder: a goroutine that unlocks turns and asks for them
// again at once comes after the one that was waiting, where a sync.Mutex
// would let it take the lock back.
func TestTurnsAreInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mu := make(turns, 1)
		mu.Lock()
		var order []string
		for _, name := range []string{"first", "second"} {
			go func() {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
			}()
			synctest.Wait() // it waits for its turn
		}
		mu.Unlock()
		mu.Lock()
		order = append(order, "again")
		mu.Unlock()
		if got := strings.Join(order, ","); got != "first,second,again" {
			t.Fatalf("turns taken %s, want first,second,again", got)
		}
	})
}

// TestCloseWriteDuringAFirstWrite: CloseWrite, called while another
// goroutine makes a fresh stream's first write, waits for that write's
// frame, which carries the stream's SYN: muxado counts the SYN sent before
// the frame is written, and a FIN sent in between would reach the peer
// for a stream it does not know (it answers with a reset, and never
// accepts the stream). The first write is held in between until CloseWrite
// has either sent its FIN or waited 100 ms.
func TestCloseWriteDuringAFirstWrite(t *testing.T) {
	client, server := sessionPair(t, true)
	msg := []byte("first write")
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	hook := func(s *Stream) {
		if s != st {
			return
		}
		go func() { closed <- st.CloseWrite() }()
		testwait.For(t, func() bool {
			st.mu.Lock()
			defer st.mu.Unlock()
			return st.writers == 2 || len(closed) > 0 // CloseWrite is under way, or done
		})
		select {
		case err := <-closed: // it did not wait: its FIN is out
			closed <- err
		case <-time.After(100 * time.Millisecond):
		}
	}
	testHookFirstFrame.Store(&hook)
	defer testHookFirstFrame.Store(nil)
	if _, err := st.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	peer := acceptStream(t, server)
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(peer)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the peer read %q, then %v; want %q, then EOF", got, err, msg)
	}
}

// TestCloseDuringAFirstWrite: Close, called while another goroutine makes
// a fresh stream's first write, leaves the stream's SYN sent once at most.
// muxado counts a stream's SYN sent when a write of its own claims it, and
// the Close of a reset (Close with a write under way resets the stream)
// claims it when nothing had: its FIN then carries a SYN, and the peer
// accepts an empty stream. A first write that had found the stream open
// and then wrote its frame directly, SYN flag set, sent a second SYN for
// the same stream, which ends the peer's session (ProtocolError): every
// other stream of it with it. The first write is held just before it
// claims the SYN until the reset is done.
func TestCloseDuringAFirstWrite(t *testing.T) {
	client, server := sessionPair(t, true)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	hook := func(s *Stream) {
		if s != st {
			return
		}
		st.Close()       // a write is under way: it resets the stream
		client.wg.Wait() // the reset: its frames, and muxado's Close
	}
	testHookClaimSyn.Store(&hook)
	defer testHookClaimSyn.Store(nil)
	_, werr := st.Write([]byte("first write"))
	t.Logf("the first write, the stream closed under it: %v", werr)

	// The peer's session lives on: a new stream reaches it (after the
	// empty one muxado's Close opened, if any).
	next, err := client.OpenStream()
	if err == nil {
		_, err = next.Write([]byte("alive"))
	}
	if err != nil {
		why := make(chan error, 1)
		go func() { _, remote, _ := client.Wait(); why <- remote }()
		select {
		case remote := <-why:
			t.Fatalf("%v: the peer's session ended: %v", err, remote)
		case <-time.After(10 * time.Second):
			t.Fatal(err)
		}
	}
	for {
		peer := acceptStream(t, server) // fails the test if the peer's session ended
		peer.SetReadDeadline(time.Now().Add(10 * time.Second))
		if peer.Id() == st.Id() {
			if got, err := io.ReadAll(peer); len(got) != 0 || err != nil {
				t.Fatalf("the closed stream, at the peer: read %q, %v; want EOF at once", got, err)
			}
			continue
		}
		got := make([]byte, len("alive"))
		n, err := io.ReadFull(peer, got)
		if peer.Id() != next.Id() || err != nil {
			t.Fatalf("the peer accepted stream %d and read %q, %v; want stream %d and %q", peer.Id(), got[:n], err, next.Id(), "alive")
		}
		return
	}
}
