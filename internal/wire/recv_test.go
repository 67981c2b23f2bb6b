package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"
	"golang.ngrok.com/muxado/v2/frame"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// FuzzRecv fills a recv with frames of the sizes the input gives, some
// read from the connection already (ready) and some not, and reads them
// in pieces of other sizes: every byte comes out once, in order, the
// count of unread bytes stays true, and a drained recv holds no chunk.
func FuzzRecv(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 7, 0, 255, 9})
	f.Add([]byte{0xff, 0xff, 0xfe, 0x10, 0x01})
	f.Add(bytes.Repeat([]byte{0x80, 0x11}, 40))
	f.Fuzz(func(t *testing.T, ops []byte) {
		const window = 1 << 20
		r := newRecv()
		var in, out []byte
		seq := byte(0)
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], int(ops[i+1])
			switch op % 3 {
			case 0, 1: // a frame
				n := arg * (1 + int(op)%300) // up to about 76 KiB: past the largest chunk
				if r.n+n > window {
					continue
				}
				p := make([]byte, n)
				for j := range p {
					p[j] = seq
					seq++
				}
				ready := 0
				if op%2 == 0 {
					ready = n
				}
				taken, err := r.fill(bytes.NewReader(p), n, false, window, ready)
				if err != nil || !taken {
					t.Fatalf("fill of %d: taken %v, %v", n, taken, err)
				}
				in = append(in, p...)
			case 2: // a read
				b := make([]byte, 1+arg*int(op)%70000)
				if r.n == 0 {
					continue
				}
				n, more, err := r.read(b)
				if more || err != nil || n == 0 {
					t.Fatalf("read: %d, more %v, %v", n, more, err)
				}
				out = append(out, b[:n]...)
			}
			held := 0
			for k, c := range r.chunks {
				held += len(*c)
				if k == 0 {
					held -= r.off
				}
			}
			if held != r.n {
				t.Fatalf("chunks hold %d unread bytes, counted %d", held, r.n)
			}
			if r.n == 0 && r.chunks != nil {
				t.Fatalf("a drained recv holds %d chunks", len(r.chunks))
			}
		}
		for r.n > 0 {
			b := make([]byte, 1000)
			n, _, _ := r.read(b)
			out = append(out, b[:n]...)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("read %d bytes, not the %d filled in order", len(out), len(in))
		}
		if taken, err := r.fill(bytes.NewReader(make([]byte, window+1)), window+1, false, window, 0); taken || !errors.Is(err, errWindowPassed) {
			t.Fatalf("a frame past the window: taken %v, %v; want %v", taken, err, errWindowPassed)
		}
	})
}

// serverOf returns the Session of a sessionPair's server end.
func serverOf(s muxado.Session) *Session { return s.(asMuxado).Session }

// TestStreamBytesBeforeAccept: what the peer sends on a stream before it
// is accepted, in several frames, is read in order after it is, and a
// drained stream holds no memory for what it read.
func TestStreamBytesBeforeAccept(t *testing.T) {
	client, server := sessionPair(t, false)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 5 {
		p := bytes.Repeat([]byte{byte('a' + i)}, 1000*(i+1))
		want = append(want, p...)
		if _, err := st.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	st.CloseWrite()
	s := serverOf(server)
	testwait.Within(t, testwait.DefaultBound, "the stream's bytes to arrive", func() bool {
		r := s.pendingRecv(uint32(st.Id()), false)
		if r == nil {
			return false
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.fin
	})
	peer := acceptStream(t, server)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written in order", len(got), len(want))
	}
	if rx := peer.(*Stream).rx; rx.chunks != nil || rx.n != 0 {
		t.Fatalf("a drained stream holds %d chunks, %d bytes", len(rx.chunks), rx.n)
	}
	if s.pendingRecv(uint32(st.Id()), false) != nil {
		t.Fatal("an accepted stream is still pending")
	}
}

// TestBytesWhileAccepting: a frame the framer reads while AcceptStream
// moves its stream from the pending ones to the others (between the
// framer's looks at the two) reaches the stream.
func TestBytesWhileAccepting(t *testing.T) {
	client, server := sessionPair(t, false)
	s := serverOf(server)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st.Write([]byte("a"))
	testwait.Within(t, testwait.DefaultBound, "the stream to be pending", func() bool {
		return s.pendingRecv(uint32(st.Id()), false) != nil
	})
	missed, accepted := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(missed)
			<-accepted
		})
	}
	testHookRecvMissed.Store(&hook)
	defer testHookRecvMissed.Store(nil)
	st.Write([]byte("b"))
	<-missed
	peer := acceptStream(t, server)
	close(accepted)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 2)
	if n, err := io.ReadFull(peer, b); err != nil {
		t.Fatalf("read %q, %v; want %q", b[:n], err, "ab")
	}
}

// TestRefusedStreamsAreNotPending: streams muxado refuses (its accept
// queue is full) leave nothing behind.
func TestRefusedStreamsAreNotPending(t *testing.T) {
	client, server := sessionPair(t, false)
	s := serverOf(server)
	const streams = 200 // muxado queues 128 for accepting
	var refused atomic.Int32
	for range streams {
		st, err := client.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		go func() {
			if _, err := io.Copy(io.Discard, st); err != nil {
				refused.Add(1) // the peer's RST (the queued streams end with the session)
			}
		}()
	}
	testwait.Within(t, testwait.DefaultBound, "the streams past the queue to be refused", func() bool { return refused.Load() == streams-128 })
	s.pmu.Lock()
	n := len(s.pending)
	s.pmu.Unlock()
	if n != 128 {
		t.Fatalf("%d streams pending, want the 128 muxado queued", n)
	}
}

// TestReadDeadline: a Read waiting for bytes returns once its deadline
// passes, a deadline moved into the past wakes it, and Reads go on once
// the deadline is lifted.
func TestReadDeadline(t *testing.T) {
	client, server := sessionPair(t, false)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st.Write([]byte("x"))
	peer := acceptStream(t, server)
	b := make([]byte, 10)
	if n, err := peer.Read(b); n != 1 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}

	peer.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := peer.Read(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want %v", err, os.ErrDeadlineExceeded)
	}

	peer.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := peer.Read(b)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it wait
	peer.SetReadDeadline(time.Now())
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a waiting read, its deadline moved to now: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting read never saw its deadline move to now")
	}

	peer.SetReadDeadline(time.Time{})
	st.Write([]byte("yz"))
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.ReadFull(peer, b[:2]); n != 2 || err != nil || string(b[:2]) != "yz" {
		t.Fatalf("after the deadline was lifted: %q, %v", b[:n], err)
	}
}

// TestReadAfterTheStreamEnds: after the peer resets the stream, a Read
// returns what came before the reset, then fails (not io.EOF); after a
// Close here, at once, and the bytes unread are let go.
func TestReadAfterTheStreamEnds(t *testing.T) {
	client, server := sessionPair(t, false)
	s := serverOf(server)

	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st.Write([]byte("before"))
	peer := acceptStream(t, server).(*Stream)
	st.Reset()
	testwait.Within(t, testwait.DefaultBound, "the reset to arrive", peer.over)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(peer)
	if string(got) != "before" || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %q, %v; want %q and the reset's error", got, err, "before")
	}

	st2, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st2.Write(make([]byte, 5000))
	peer2 := acceptStream(t, server).(*Stream)
	testwait.Within(t, testwait.DefaultBound, "the bytes to arrive", func() bool {
		peer2.rx.mu.Lock()
		defer peer2.rx.mu.Unlock()
		return peer2.rx.n == 5000
	})
	peer2.Close()
	if n, err := peer2.Read(make([]byte, 10)); n != 0 || err == nil {
		t.Fatalf("read after Close: %d, %v", n, err)
	}
	if peer2.rx.chunks != nil {
		t.Fatal("a closed stream holds its unread bytes")
	}
	if u := s.unread.Load(); u != 0 {
		t.Fatalf("the session counts %d bytes unread", u)
	}
}

// TestPeerPastItsWindowEndsTheSession: a peer that sends a stream more
// than its window (muxado's flow control broken) ends the session.
func TestPeerPastItsWindowEndsTheSession(t *testing.T) {
	conn, sc := tcpPair(t)
	defer conn.Close()
	s := NewSession(sc, MinWindow, false, 0)
	defer s.Close()

	raw := frame.NewFramer(conn, conn)
	go io.Copy(io.Discard, conn)
	p := make([]byte, MinWindow/2)
	for i := range 3 {
		var d frame.Data
		if err := d.Pack(1, p, false, i == 0); err != nil {
			t.Fatal(err)
		}
		if err := raw.WriteFrame(&d); err != nil {
			break // the session ended
		}
	}
	ended := make(chan error, 1)
	go func() {
		err, _, _ := s.Wait()
		ended <- err
	}()
	select {
	case err := <-ended:
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte("window")) {
			t.Fatalf("the session ended with %v, want %v", err, errWindowPassed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived a peer that sent past its window")
	}
}

// gatedConn is a conn whose writes wait while its gate is shut.
type gatedConn struct {
	net.Conn
	mu   sync.Mutex
	gate chan struct{} // closed: open
}

func (c *gatedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	g := c.gate
	c.mu.Unlock()
	<-g
	return c.Conn.Write(p)
}

func (c *gatedConn) shut() {
	c.mu.Lock()
	c.gate = make(chan struct{})
	c.mu.Unlock()
}

func (c *gatedConn) open() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.gate:
	default:
		close(c.gate)
	}
}

// TestReadsDoNotWaitForAStalledWrite: while a write holds the framer,
// stalled on the connection, a stream's Reads go on (their window updates
// are held, not written), and the updates that must go are written once
// the write is: the peer gets its window back.
func TestReadsDoNotWaitForAStalledWrite(t *testing.T) {
	cc, sc := tcpPair(t)
	gated := &gatedConn{Conn: cc, gate: make(chan struct{})}
	close(gated.gate)
	client := NewSession(gated, MinWindow, true, 0)
	server := NewSession(sc, MinWindow, false, 0)
	t.Cleanup(func() {
		gated.open()
		client.Close()
		server.Close()
	})

	down, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	down.Write([]byte("x"))
	peer, err := server.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	io.ReadFull(peer, one)

	// A window's worth arrives; then the client's writes stall, one of
	// them holding the framer.
	if _, err := peer.Write(make([]byte, MinWindow)); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, testwait.DefaultBound, "a window's bytes to arrive", func() bool {
		down.rx.mu.Lock()
		defer down.rx.mu.Unlock()
		return down.rx.n == MinWindow
	})
	gated.shut()
	up, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	go up.Write([]byte("stalled"))
	testwait.Within(t, testwait.DefaultBound, "a write to hold the framer", func() bool { return len(client.fr.mu) == 1 })

	read := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(down, make([]byte, MinWindow))
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reads waited for a write stalled on the connection")
	}

	// Once the write goes, the window updates go: the peer sends a
	// window more.
	gated.open()
	sent := make(chan error, 1)
	go func() {
		_, err := peer.Write(make([]byte, MinWindow))
		sent <- err
	}()
	go io.Copy(io.Discard, down)
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer never got its window back")
	}
}
