package wire

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// tlsSessionPair returns Sessions over TLS over loopback TCP, the writes
// beneath each end's TLS conn counted; with batch, each TLS conn is made
// over BatchWrites.
func tlsSessionPair(t testing.TB, batch bool) (client, server *Session, cw, sw *writeCounter) {
	return tlsSessionPairLevels(t, batch, 1)
}

// tlsSessionPairLevels is tlsSessionPair with levels of TLS, each over
// the one before (2: an agent's TLS to the edge through an https proxy's
// TLS).
func tlsSessionPairLevels(t testing.TB, batch bool, levels int) (client, server *Session, cw, sw *writeCounter) {
	t.Helper()
	ca := testpki.New(t)
	scfg := &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}}
	ccfg := &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}
	raw, sraw := tcpPair(t)
	cw, sw = &writeCounter{Conn: raw}, &writeCounter{Conn: sraw}
	wrap := func(c net.Conn) net.Conn {
		if batch {
			return BatchWrites(c)
		}
		return c
	}
	var ctc, stc *tls.Conn
	var cc, sc net.Conn = cw, sw
	for range levels {
		ctc, stc = tls.Client(wrap(cc), ccfg), tls.Server(wrap(sc), scfg)
		errc := make(chan error, 1)
		go func() { errc <- stc.Handshake() }()
		if err := ctc.Handshake(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		cc, sc = ctc, stc
	}
	client, server = NewSession(ctc, DefaultWindow, true, 0), NewSession(stc, DefaultWindow, false, 0)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server, cw, sw
}

// TestBatchWritesOneWritePerFrame: a TLS conn writes each record to its
// conn apart, four for a frame of MaxFrameData; over BatchWrites, a
// frame's records go in one Write.
// Through TLS over TLS, likewise at the bottom.
func TestBatchWritesOneWritePerFrame(t *testing.T) {
	const size = 2 << 20 // 32 frames of MaxFrameData
	frames := size / MaxFrameData
	for _, c := range []struct {
		batch  bool
		levels int
	}{{true, 1}, {false, 1}, {true, 2}, {false, 2}} {
		batch := c.batch
		t.Run(fmt.Sprintf("batch=%v,levels=%d", c.batch, c.levels), func(t *testing.T) {
			client, server, _, sw := tlsSessionPairLevels(t, c.batch, c.levels)
			st, err := client.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Write([]byte("go")); err != nil {
				t.Fatal(err)
			}
			sst, err := server.AcceptStream()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(sst, make([]byte, 2)); err != nil {
				t.Fatal(err)
			}
			// The TLS 1.3 handshake's session tickets and the client's
			// first frame were written before this count, and the
			// first 128 KB of a TLS conn's data go in small records
			// (crypto/tls's dynamic record sizing): the count starts
			// after them.
			warm := bytes.Repeat([]byte{'w'}, 256<<10)
			done := make(chan error, 1)
			go func() {
				_, err := io.ReadFull(st, make([]byte, len(warm)))
				done <- err
			}()
			if _, err := sst.Write(warm); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}

			before, heard := sw.writes.Load(), client.Heard()
			payload := make([]byte, size)
			rand.Read(payload)
			go func() {
				got, err := io.ReadAll(io.LimitReader(st, size))
				if err == nil && !bytes.Equal(got, payload) {
					err = errors.New("the payload arrived altered")
				}
				done <- err
			}()
			if _, err := sst.Write(payload); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			writes := sw.writes.Load() - before
			// The frames the client read: as many as the server wrote,
			// more than size/MaxFrameData when the window cut some short.
			heard = client.Heard() - heard
			t.Logf("%d MiB in %d frames (%d if all were MaxFrameData): %d writes beneath the TLS conn", size>>20, heard, frames, writes)
			if batch && writes > int64(heard)+2 {
				t.Errorf("%d writes for %d frames: want one each", writes, heard)
			}
			if !batch && writes < 2*int64(heard) {
				t.Errorf("without BatchWrites, %d writes for %d frames: the count does not see the records", writes, heard)
			}
		})
	}
}

// TestBatchWritesIntact moves data both ways on several streams at once
// over TLS links made over BatchWrites at both ends: every byte arrives,
// in order.
func TestBatchWritesIntact(t *testing.T) {
	client, server, _, _ := tlsSessionPair(t, true)
	const streams, size = 8, 2 << 20
	go func() {
		for {
			st, err := server.AcceptStream()
			if err != nil {
				return
			}
			go func() {
				io.Copy(st, st)
				st.CloseWrite()
			}()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Go(func() {
			st, err := client.OpenStream()
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			payload := make([]byte, size+i*1000)
			rand.Read(payload)
			want := sha256.Sum256(payload)
			go func() {
				// Writes in sizes that are not frames or records.
				for b := payload; len(b) > 0; {
					n := min(len(b), 10_000+i*7919)
					if _, err := st.Write(b[:n]); err != nil {
						return
					}
					b = b[n:]
				}
				st.CloseWrite()
			}()
			h := sha256.New()
			n, err := io.Copy(h, st)
			if err != nil {
				errs <- err
				return
			}
			if n != int64(len(payload)) || !bytes.Equal(h.Sum(nil), want[:]) {
				errs <- fmt.Errorf("stream %d: %d bytes back of %d, or altered", i, n, len(payload))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestBatchConn: a batch gathers the writes made while it is open, its
// own and other goroutines', in their order, and writes them in one Write;
// outside a batch a write goes straight to the conn; a failed flush says
// so.
func TestBatchConn(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	cc := &writeCounter{Conn: a}
	c := BatchWrites(cc).(*batchConn)
	got := make(chan []byte, 8)
	go func() {
		for {
			buf := make([]byte, 64)
			n, err := b.Read(buf)
			if err != nil {
				close(got)
				return
			}
			got <- buf[:n]
		}
	}()

	if _, err := c.Write([]byte("straight")); err != nil {
		t.Fatal(err)
	}
	if g := string(<-got); g != "straight" {
		t.Fatalf("outside a batch: read %q", g)
	}

	c.open()
	c.Write([]byte("one,"))
	done := make(chan struct{})
	go func() {
		c.Write([]byte("two,")) // another writer joins the open batch
		close(done)
	}()
	<-done
	c.Write([]byte("three"))
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("%d writes before the flush, want the 1 outside the batch", n)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	if g := string(<-got); g != "one,two,three" {
		t.Fatalf("batch: read %q", g)
	}
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("%d writes after the flush, want 2", n)
	}

	c.open()
	c.Write([]byte("lost"))
	b.Close()
	if err := c.flush(); err == nil {
		t.Fatal("flush to a closed peer succeeded")
	}
	if _, err := c.Write([]byte("after")); err == nil {
		t.Fatal("write after a failed flush, outside a batch, succeeded")
	}
}

// TestBatchOf: the framer batches only a TLS conn made over BatchWrites.
func TestBatchOf(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if batchOf(a) != nil || batchOf(tls.Client(a, &tls.Config{})) != nil {
		t.Error("batchOf found a batch beneath a conn not made over BatchWrites")
	}
	if batchOf(BatchWrites(a)) != nil {
		t.Error("batchOf found a batch in the batching conn itself: only a TLS conn over it batches")
	}
	if batchOf(tls.Client(BatchWrites(a), &tls.Config{})) == nil {
		t.Error("batchOf missed the batch beneath a TLS conn")
	}
}

// BenchmarkSessionBulkTLS: one-way bulk in 1 MiB writes through a Session
// over TLS over loopback TCP, with and without BatchWrites beneath the
// TLS conns, reporting the writes beneath the sender's TLS conn per MiB.
//
//	go test ./internal/wire -run '^$' -bench SessionBulkTLS -count 3
func BenchmarkSessionBulkTLS(b *testing.B) {
	for _, batch := range []bool{false, true} {
		b.Run(fmt.Sprintf("batch=%v", batch), func(b *testing.B) {
			client, server, cw, _ := tlsSessionPair(b, batch)
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
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			before := cw.writes.Load()
			for b.Loop() {
				if _, err := st.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cw.writes.Load()-before)/float64(b.N), "writes/MiB")
		})
	}
}

// TestBatchConnWriteDuringFlush: a write made while a batch is being
// written to a peer that reads nothing returns at once, and is written
// after the batch. (The TLS conn's Close sends its close_notify alert so:
// it must not wait behind a stalled socket. Without this the test hangs:
// it lets the peer read only once that write returned.)
func TestBatchConnWriteDuringFlush(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cc := &writeCounter{Conn: a}
	c := BatchWrites(cc).(*batchConn)
	c.open()
	c.Write([]byte("batch;"))
	flushed := make(chan error, 1)
	go func() { flushed <- c.flush() }()
	testwait.For(t, func() bool { return cc.writes.Load() == 1 }) // the flush is writing, and nobody reads

	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("alert"))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write waited behind the stalled flush")
	}

	want := "batch;alert"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("%d writes, want 2: the batch, then what joined it", n)
	}
	// The batch is over: a write goes straight to the conn again.
	go b.Read(make([]byte, 16))
	if _, err := c.Write([]byte("straight")); err != nil {
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 3 {
		t.Fatalf("%d writes, want 3", n)
	}
}
