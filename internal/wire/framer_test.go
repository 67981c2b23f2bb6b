package wire

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"golang.ngrok.com/muxado/v2"
	"golang.ngrok.com/muxado/v2/frame"
)

// recorder is an io.Writer that keeps each Write apart.
type recorder struct {
	writes [][]byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

func (r *recorder) all() []byte { return bytes.Join(r.writes, nil) }

func packData(t testing.TB, id frame.StreamId, p []byte, fin, syn bool) *frame.Data {
	t.Helper()
	f := new(frame.Data)
	if err := f.Pack(id, p, fin, syn); err != nil {
		t.Fatal(err)
	}
	return f
}

func packWndInc(t testing.TB, id frame.StreamId, inc uint32) *frame.WndInc {
	t.Helper()
	f := new(frame.WndInc)
	if err := f.Pack(id, inc); err != nil {
		t.Fatal(err)
	}
	return f
}

func packRst(t testing.TB, id frame.StreamId, code frame.ErrorCode) *frame.Rst {
	t.Helper()
	f := new(frame.Rst)
	if err := f.Pack(id, code); err != nil {
		t.Fatal(err)
	}
	return f
}

func packGoAway(t testing.TB, last frame.StreamId, code frame.ErrorCode, debug []byte) *frame.GoAway {
	t.Helper()
	f := new(frame.GoAway)
	if err := f.Pack(last, code, debug); err != nil {
		t.Fatal(err)
	}
	return f
}

// stockBytes returns the stock framer's encoding of frames.
func stockBytes(t testing.TB, frames ...frame.Frame) []byte {
	t.Helper()
	var b bytes.Buffer
	fr := frame.NewFramer(nil, &b)
	for _, f := range frames {
		if err := fr.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// payload returns n bytes of a pattern that repeats every 64 KiB.
func payload(n int) []byte {
	p := make([]byte, n)
	for i := range min(n, 1<<16) {
		p[i] = byte(i*7 + i>>8)
	}
	// The rest copies what is there (byte by byte, the race detector
	// makes 16 MiB take seconds).
	for done := min(n, 1<<16); done < n; done *= 2 {
		copy(p[done:], p[:done])
	}
	return p
}

// frameCases are frames of every type with small, empty and large bodies.
func frameCases(t testing.TB) []struct {
	name string
	f    frame.Frame
} {
	return []struct {
		name string
		f    frame.Frame
	}{
		{"data", packData(t, 1, []byte("hello"), false, false)},
		{"data syn", packData(t, 3, []byte("GET / HTTP/1.1\r\n\r\n"), false, true)},
		{"data empty fin", packData(t, 5, nil, true, false)},
		{"data empty syn fin", packData(t, 7, []byte{}, true, true)},
		{"data one byte", packData(t, 0x7fffffff, []byte{0}, false, false)},
		{"data copy limit", packData(t, 2, payload(copyLimit), false, false)},
		{"data past copy limit", packData(t, 4, payload(copyLimit+1), true, false)},
		{"data 1 MiB", packData(t, 6, payload(1<<20), false, true)},
		{"wndinc", packWndInc(t, 9, 1)},
		{"wndinc max", packWndInc(t, 11, wndIncMaxIncr)},
		{"rst", packRst(t, 13, frame.ErrorCode(muxado.StreamClosed))},
		{"rst max code", packRst(t, 0x7fffffff, 0xffffffff)},
		{"goaway", packGoAway(t, 15, frame.ErrorCode(muxado.NoError), []byte("no error"))},
		{"goaway no debug", packGoAway(t, 0, frame.ErrorCode(muxado.ProtocolError), nil)},
		{"goaway large debug", packGoAway(t, 17, 1, payload(70<<10))},
	}
}

// TestFramerWritesStockBytes checks that each frame is encoded exactly as
// the stock framer does, and that small frames go in one Write.
func TestFramerWritesStockBytes(t *testing.T) {
	cases := append(frameCases(t), struct {
		name string
		f    frame.Frame
	}{"data max length", packData(t, 8, payload(maxLength), false, false)})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if testtools.RaceEnabled && int(c.f.Length()) == maxLength {
				t.Skip("16 MiB of copies the race detector makes slow: .ci/run runs it without it")
			}
			var rec recorder
			// hold 1: every window update is written at once.
			fr := newFramer(nil, &rec, 1)
			if err := fr.WriteFrame(c.f); err != nil {
				t.Fatal(err)
			}
			want := stockBytes(t, c.f)
			if got := rec.all(); !bytes.Equal(got, want) {
				t.Fatalf("wrote %d bytes % x..., want %d bytes % x...", len(got), head(got), len(want), head(want))
			}
			if _, ok := c.f.(*frame.GoAway); !ok && int(c.f.Length()) <= copyLimit && len(rec.writes) != 1 {
				t.Errorf("%d writes, want 1", len(rec.writes))
			}
		})
	}
}

func head(b []byte) []byte { return b[:min(len(b), 24)] }

// TestFramerReadsEveryFrame reads a stock-encoded sequence of every frame
// type (and an unknown one) back through the framer, whole and one byte
// per Read, and compares each field with what the stock framer reads.
func TestFramerReadsEveryFrame(t *testing.T) {
	var frames []frame.Frame
	for _, c := range frameCases(t) {
		frames = append(frames, c.f)
	}
	wire := stockBytes(t, frames...)
	// An unknown frame type (0xE) with a 3-byte body, then a DATA frame
	// to show the unknown body was skipped.
	wire = append(wire, 0, 0, 3, 0xE5, 0, 0, 0, 21, 'a', 'b', 'c')
	wire = append(wire, stockBytes(t, packData(t, 23, []byte("after"), true, false))...)

	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return bytes.NewReader(wire) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(wire)) },
		"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(wire)) },
	}
	for name, r := range readers {
		t.Run(name, func(t *testing.T) {
			got := readAll(t, NewFramer(r(), io.Discard))
			want := readAll(t, frame.NewFramer(bytes.NewReader(wire), io.Discard))
			if len(got) != len(frames)+2 || len(got) != len(want) {
				t.Fatalf("read %d frames, stock %d, want %d", len(got), len(want), len(frames)+2)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("frame %d:\n got %s\nwant %s", i, got[i], want[i])
				}
			}
		})
	}
}

// readAll reads frames until EOF and describes each, body included.
func readAll(t *testing.T, fr frame.Framer) []string {
	t.Helper()
	var out []string
	for {
		f, err := fr.ReadFrame()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		s := fmt.Sprintf("%v id=%d len=%d flags=%x", f.Type(), f.StreamId(), f.Length(), f.Flags())
		var body []byte
		switch f := f.(type) {
		case *frame.Data:
			body, err = io.ReadAll(f.Reader())
		case *frame.WndInc:
			s += fmt.Sprintf(" inc=%d", f.WindowIncrement())
		case *frame.Rst:
			s += fmt.Sprintf(" code=%d", f.ErrorCode())
		case *frame.GoAway:
			s += fmt.Sprintf(" last=%d code=%d", f.LastStreamId(), f.ErrorCode())
			body, err = io.ReadAll(f.Debug())
		case *frame.Unknown:
			body, err = io.ReadAll(f.PayloadReader())
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s body=%x", s, sha256.Sum256(body)))
	}
}

// TestFramerHoldsWindowUpdates checks when held window updates go out:
// merged per stream, in order, in the same Write as the next frame, at
// once past the threshold or when the table is full, and before a frame
// the framer hands to the stock one.
func TestFramerHoldsWindowUpdates(t *testing.T) {
	var rec recorder
	fr := newFramer(nil, &rec, 100)
	write := func(f frame.Frame) {
		t.Helper()
		if err := fr.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want ...frame.Frame) {
		t.Helper()
		switch {
		case len(want) == 0 && len(rec.writes) != 0:
			t.Fatalf("wrote % x, want nothing", rec.all())
		case len(want) > 0 && len(rec.writes) != 1:
			t.Fatalf("%d writes, want 1", len(rec.writes))
		case len(want) > 0 && !bytes.Equal(rec.writes[0], stockBytes(t, want...)):
			t.Fatalf("wrote\n% x\nwant\n% x", rec.writes[0], stockBytes(t, want...))
		}
		rec.writes = nil
	}

	write(packWndInc(t, 1, 10))
	write(packWndInc(t, 3, 20))
	write(packWndInc(t, 1, 30))
	expect()
	write(packData(t, 5, []byte("x"), false, false))
	expect(packWndInc(t, 1, 40), packWndInc(t, 3, 20), packData(t, 5, []byte("x"), false, false))

	write(packWndInc(t, 7, 100))
	expect(packWndInc(t, 7, 100))

	write(packWndInc(t, 9, 60))
	write(packWndInc(t, 11, 5))
	write(packWndInc(t, 9, 50))
	expect(packWndInc(t, 9, 110), packWndInc(t, 11, 5))

	var all []frame.Frame
	for i := range maxHeld {
		id := frame.StreamId(2*i + 1)
		write(packWndInc(t, id, 1))
		all = append(all, packWndInc(t, id, 1))
	}
	expect(all...)

	write(packWndInc(t, 13, 1))
	write(packRst(t, 13, 5))
	expect(packWndInc(t, 13, 1), packRst(t, 13, 5))

	write(packWndInc(t, 15, 2))
	write(packGoAway(t, 15, 0, []byte("bye")))
	if got, want := rec.all(), stockBytes(t, packWndInc(t, 15, 2), packGoAway(t, 15, 0, []byte("bye"))); !bytes.Equal(got, want) {
		t.Fatalf("wrote\n% x\nwant\n% x", got, want)
	}
	rec.writes = nil

	// A merged increment never passes the largest a frame can carry: one
	// that would is held as a second update of the stream.
	fr = newFramer(nil, &rec, wndIncMaxIncr)
	write(packWndInc(t, 17, wndIncMaxIncr-1))
	write(packWndInc(t, 17, 2))
	expect()
	write(packData(t, 19, nil, true, false))
	expect(packWndInc(t, 17, wndIncMaxIncr-1), packWndInc(t, 17, 2), packData(t, 19, nil, true, false))
}

type failWriter struct{}

var errWrite = errors.New("write failed")

func (failWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestFramerWriteError(t *testing.T) {
	fr := newFramer(nil, failWriter{}, 100)
	if err := fr.WriteFrame(packWndInc(t, 1, 1)); err != nil {
		t.Fatalf("held update: %v, want nil", err)
	}
	for _, f := range []frame.Frame{
		packData(t, 1, []byte("x"), false, false),
		packData(t, 1, payload(copyLimit+1), false, false),
		packRst(t, 1, 1),
		packWndInc(t, 1, 100),
		packGoAway(t, 1, 1, nil),
	} {
		if err := fr.WriteFrame(f); !errors.Is(err, errWrite) {
			t.Errorf("%v: %v, want %v", f.Type(), err, errWrite)
		}
	}
}

// failOnce is a writer whose first Write fails.
type failOnce struct {
	recorder
	failed bool
}

func (w *failOnce) Write(p []byte) (int, error) {
	if !w.failed {
		w.failed = true
		return 0, errWrite
	}
	return w.recorder.Write(p)
}

// TestFramerStopsAfterGoAwayOrError checks that after a GOAWAY or a failed
// write the framer writes nothing more and does not read the frames it is
// given: muxado may hand it frames whose writers gave up on the dying
// session and are packing them again. Run with -race, the concurrent Pack
// shows any read.
func TestFramerStopsAfterGoAwayOrError(t *testing.T) {
	var rec recorder
	fr := newFramer(nil, &rec, 100)
	if err := fr.WriteFrame(packGoAway(t, 0, 0, []byte("no error"))); err != nil {
		t.Fatal(err)
	}
	rec.writes = nil
	var repacks sync.WaitGroup
	defer repacks.Wait()
	abandoned := func() *frame.Data {
		d := packData(t, 1, []byte("abandoned"), false, false)
		repacks.Go(func() { d.Pack(1, nil, true, false) }) // its writer packs it again
		return d
	}
	for _, f := range []frame.Frame{abandoned(), packWndInc(t, 1, 1000), packRst(t, 1, 1)} {
		if err := fr.WriteFrame(f); !errors.Is(err, errGoneAway) {
			t.Errorf("%v after GOAWAY: %v, want %v", f.Type(), err, errGoneAway)
		}
	}
	if len(rec.writes) != 0 {
		t.Errorf("wrote % x after GOAWAY", rec.all())
	}

	var w failOnce
	fr = newFramer(nil, &w, 100)
	if err := fr.WriteFrame(packData(t, 1, []byte("x"), false, false)); !errors.Is(err, errWrite) {
		t.Fatalf("first write: %v, want %v", err, errWrite)
	}
	for _, f := range []frame.Frame{abandoned(), packWndInc(t, 1, 1000), packGoAway(t, 0, 0, nil)} {
		if err := fr.WriteFrame(f); !errors.Is(err, errWrite) {
			t.Errorf("%v after a failed write: %v, want %v", f.Type(), err, errWrite)
		}
	}
	if len(w.writes) != 0 {
		t.Errorf("wrote % x after a failed write", w.all())
	}
}

// A session pairing: the framer of each end, or nil for the stock one.
type pairing struct {
	name           string
	client, server func(io.Reader, io.Writer) frame.Framer
	window         uint32
}

func pairings() []pairing {
	tiny := func(r io.Reader, w io.Writer) frame.Framer { return newFramer(r, w, 1<<10) }
	return []pairing{
		{name: "framer-framer", client: NewFramer, server: NewFramer},
		{name: "framer-stock", client: NewFramer},
		{name: "stock-framer", server: NewFramer},
		// An 8 KiB window with 1 KiB held: flow control binds all the time.
		{name: "tiny-window", client: tiny, server: tiny, window: 8 << 10},
	}
}

func (p pairing) config(nf func(io.Reader, io.Writer) frame.Framer) *muxado.Config {
	c := &muxado.Config{MaxWindowSize: p.window, NewFramer: nf}
	if c.MaxWindowSize == 0 {
		c.MaxWindowSize = DefaultWindow
	}
	return c
}

type transport struct {
	name  string
	conns func(t testing.TB) (net.Conn, net.Conn)
}

var transports = []transport{
	{"pipe", func(t testing.TB) (net.Conn, net.Conn) { return net.Pipe() }},
	{"tcp", tcpPair},
}

func tcpPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return a, r.c
}

// sessions returns a client and a server session over a fresh transport,
// closed at the end of the test.
func sessions(t testing.TB, tr transport, p pairing) (muxado.Session, muxado.Session) {
	a, b := tr.conns(t)
	client := muxado.Client(a, p.config(p.client))
	server := muxado.Server(b, p.config(p.server))
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestFramerSessionTransfer runs muxado sessions over net.Pipe and TCP
// with the framer at one or both ends and sends data both ways on
// concurrent streams opened by either side, in writes and reads of mixed
// sizes, checking each direction's SHA-256.
func TestFramerSessionTransfer(t *testing.T) {
	const size = 256 << 10 // a default window, and 32 of the tiny one
	const streams = 3      // opened by each side
	for _, tr := range transports {
		for _, p := range pairings() {
			ok := t.Run(tr.name+"/"+p.name, func(t *testing.T) {
				client, server := sessions(t, tr, p)
				// A broken framer must fail the test, not hang it:
				// closing the sessions unblocks every stream.
				var timedOut atomic.Bool
				watchdog := time.AfterFunc(time.Minute, func() {
					timedOut.Store(true)
					client.Close()
					server.Close()
				})
				defer watchdog.Stop()
				var wg sync.WaitGroup
				errs := make(chan error, 4*streams)
				for i := range streams {
					// Each side opens streams and accepts the other's.
					wg.Go(func() { errs <- openAndExchange(client, size, uint64(i)) })
					wg.Go(func() { errs <- openAndExchange(server, size, uint64(100+i)) })
					wg.Go(func() { errs <- acceptAndExchange(server, size) })
					wg.Go(func() { errs <- acceptAndExchange(client, size) })
				}
				wg.Wait()
				if timedOut.Load() {
					t.Fatal("transfer timed out")
				}
				close(errs)
				for err := range errs {
					if err != nil {
						t.Error(err)
					}
				}
				// Close sends GOAWAY through the framer: the peer reads it.
				client.Close()
				_, remote, debug := server.Wait()
				if code, _ := muxado.GetError(remote); code != muxado.NoError || string(debug) != "no error" {
					t.Errorf("server saw GOAWAY %v %q, want NoError %q", remote, debug, "no error")
				}
			})
			if !ok {
				return // the rest would most likely time out too
			}
		}
	}
}

// openAndExchange opens a stream, sends a header naming the seed and the
// data it generates, and checks that the peer answers with the SHA-256 of
// what it received followed by its own data, whose sum comes last.
func openAndExchange(s muxado.Session, size int, seed uint64) error {
	st, err := s.OpenStream()
	if err != nil {
		return err
	}
	defer st.Close()
	var hdr [8]byte
	for i := range hdr {
		hdr[i] = byte(seed >> (8 * i))
	}
	if _, err := st.Write(hdr[:]); err != nil {
		return err
	}
	return exchange(st, size, seed)
}

func acceptAndExchange(s muxado.Session, size int) error {
	st, err := s.AcceptStream()
	if err != nil {
		return err
	}
	defer st.Close()
	var hdr [8]byte
	if _, err := io.ReadFull(st, hdr[:]); err != nil {
		return err
	}
	var seed uint64
	for i := range hdr {
		seed |= uint64(hdr[i]) << (8 * i)
	}
	return exchange(st, size, seed^0xffff)
}

// exchange sends size bytes generated from seed, then its SHA-256, and at
// the same time reads the peer's bytes and sum, checking them.
func exchange(st muxado.Stream, size int, seed uint64) error {
	st.SetDeadline(time.Now().Add(time.Minute))
	sent := make(chan error, 1)
	go func() {
		h := sha256.New()
		rng := rand.New(rand.NewPCG(seed, 1))
		bytes := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)})
		buf := make([]byte, 100<<10)
		for left := size; left > 0; {
			n := min(left, writeSize(rng, len(buf)))
			p := buf[:n]
			bytes.Read(p)
			h.Write(p)
			if _, err := st.Write(p); err != nil {
				sent <- err
				return
			}
			left -= n
		}
		if _, err := st.Write(h.Sum(nil)); err != nil {
			sent <- err
			return
		}
		sent <- st.CloseWrite()
	}()

	h := sha256.New()
	rng := rand.New(rand.NewPCG(seed, 2))
	buf := make([]byte, 100<<10)
	var got int
	for got < size {
		n, err := st.Read(buf[:min(size-got, writeSize(rng, len(buf)))])
		h.Write(buf[:n])
		got += n
		if err != nil {
			return fmt.Errorf("read after %d of %d bytes: %w", got, size, err)
		}
	}
	sum, err := io.ReadAll(st)
	if err != nil {
		return fmt.Errorf("read sum: %w", err)
	}
	if !bytes.Equal(sum, h.Sum(nil)) {
		return fmt.Errorf("sum of %d bytes received %x, sender's %x", size, h.Sum(nil), sum)
	}
	return <-sent
}

// writeSize picks a write or read size: single bytes, small, mid and
// large ones, all frequent.
func writeSize(rng *rand.Rand, max int) int {
	switch rng.IntN(4) {
	case 0:
		return 1 + rng.IntN(8)
	case 1:
		return 1 + rng.IntN(1<<10)
	case 2:
		return 1 + rng.IntN(copyLimit+100)
	default:
		return 1 + rng.IntN(max)
	}
}

// TestFramerSmallReadsDoNotStall reads a long transfer one byte at a time
// on a tiny window: every read's window update is held, and the sender
// must still never wait for one.
func TestFramerSmallReadsDoNotStall(t *testing.T) {
	const window = 4 << 10
	nf := func(r io.Reader, w io.Writer) frame.Framer { return newFramer(r, w, window/2) }
	client, server := sessions(t, transports[1], pairing{client: nf, server: nf, window: window})
	const size = 64 << 10
	go func() {
		st, err := client.OpenStream()
		if err != nil {
			return
		}
		st.Write(payload(size))
		st.CloseWrite()
	}()
	st, err := server.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	st.SetReadDeadline(time.Now().Add(time.Minute))
	got, err := io.ReadAll(iotest.OneByteReader(st))
	if err != nil {
		t.Fatalf("after %d bytes: %v", len(got), err)
	}
	if !bytes.Equal(got, payload(size)) {
		t.Fatal("data differs")
	}
}

// TestMuxConfig checks the configuration both ends use.
func TestMuxConfig(t *testing.T) {
	a, b := MuxConfig(DefaultWindow), MuxConfig(DefaultWindow)
	if a == b {
		t.Error("MuxConfig returned the same *Config twice")
	}
	if a.MaxWindowSize != DefaultWindow || a.NewFramer == nil {
		t.Errorf("MuxConfig() = %+v", a)
	}
	if windowHold > MinWindow/2 {
		t.Errorf("windowHold %d too close to the smallest window %d", windowHold, MinWindow)
	}
}

// Benchmarks of a bare muxado session over TCP, stock framer against this
// one, and against the TCP connection alone (the "tcp" case: what any
// multiplexer on it could reach): a 64-byte echo on an open stream, and
// one-way bulk in 32 KiB writes.
//
//	go test ./internal/wire -run '^$' -bench 'Mux(PingPong|Bulk)' -count 3

func benchSessions(b *testing.B, nf func(io.Reader, io.Writer) frame.Framer) (muxado.Session, muxado.Session) {
	p := pairing{client: nf, server: nf}
	return sessions(b, transports[1], p)
}

var framers = []struct {
	name string
	nf   func(io.Reader, io.Writer) frame.Framer
}{{"stock", nil}, {"framer", NewFramer}}

func BenchmarkMuxPingPong(b *testing.B) {
	b.Run("tcp", func(b *testing.B) {
		c, s := tcpPair(b)
		go io.Copy(s, s)
		buf := make([]byte, 64)
		for b.Loop() {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, f := range framers {
		b.Run(f.name, func(b *testing.B) {
			client, server := benchSessions(b, f.nf)
			pingPong(b, client, server)
		})
	}
	// A Session: the framer, and each stream's bytes read into its recv.
	b.Run("session", func(b *testing.B) {
		c, s := tcpPair(b)
		client, server := NewSession(c, DefaultWindow, true, 0), NewSession(s, DefaultWindow, false, 0)
		b.Cleanup(func() { client.Close(); server.Close() })
		pingPong(b, asMuxado{client}, asMuxado{server})
	})
}

// pingPong runs b's loop of 64-byte round trips on a stream client opens
// to an echo on server.
func pingPong(b *testing.B, client, server muxado.Session) {
	go func() {
		st, err := server.AcceptStream()
		if err != nil {
			return
		}
		io.Copy(st, st)
	}()
	st, err := client.OpenStream()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 64)
	for b.Loop() {
		if _, err := st.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(st, buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMuxBulk(b *testing.B) {
	b.Run("tcp", func(b *testing.B) {
		c, s := tcpPair(b)
		go io.Copy(io.Discard, struct{ io.Reader }{s}) // a plain read loop, no splice
		buf := make([]byte, 32<<10)
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, f := range framers {
		b.Run(f.name, func(b *testing.B) {
			client, server := benchSessions(b, f.nf)
			go func() {
				st, err := server.AcceptStream()
				if err != nil {
					return
				}
				io.Copy(io.Discard, st)
			}()
			st, err := client.OpenStream()
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 32<<10)
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := st.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
