package wire

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// readerTransports are the conns a connReader reads in different ways: a
// TCP socket inside its RawConn, and through their own Read a net.Pipe, a
// TLS conn and a TCP conn wrapped by an app.
var readerTransports = []transport{
	{"tcp", tcpPair},
	{"pipe", func(t testing.TB) (net.Conn, net.Conn) { return net.Pipe() }},
	{"tls", tlsPair},
	{"wrapped-tcp", func(t testing.TB) (net.Conn, net.Conn) {
		a, b := tcpPair(t)
		return a, &countingConn{TCPConn: b.(*net.TCPConn)}
	}},
}

// countingConn is an app's wrapper of a TCP conn: its Read must be the
// one that reads, although the *net.TCPConn it embeds gives it a
// SyscallConn method.
type countingConn struct {
	*net.TCPConn
	n int
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	c.n += n
	return n, err
}

func tlsPair(t testing.TB) (net.Conn, net.Conn) {
	a, b := tcpPair(t)
	ca := testpki.New(t)
	srv := tls.Server(b, &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "edge.test")}})
	cli := tls.Client(a, &tls.Config{RootCAs: ca.Pool, ServerName: "edge.test"})
	errc := make(chan error, 1)
	go func() { errc <- srv.Handshake() }()
	if err := cli.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return cli, srv
}

// TestConnReaderReadsEveryByte writes bursts of random sizes with pauses
// between some of them, and reads them back in reads of random sizes,
// small and larger than the buffer, over each transport.
func TestConnReaderReadsEveryByte(t *testing.T) {
	for _, tr := range readerTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b := tr.conns(t)
			t.Cleanup(func() { a.Close(); b.Close() })
			c := newConnReader(b)
			if raw := tr.name == "tcp"; c.raw.ok() != raw || (c.small == nil) != raw {
				t.Fatalf("reads the socket raw: %v, want %v", c.raw.ok(), raw)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			want := make([]byte, 2<<20)
			rand.NewChaCha8([32]byte{1, 2}).Read(want)
			go func() {
				wr := rand.New(rand.NewPCG(3, 4))
				for p := want; len(p) > 0; {
					n := min(len(p), writeSize(wr, 64<<10))
					if _, err := a.Write(p[:n]); err != nil {
						return
					}
					p = p[n:]
				}
				a.Close()
			}()
			b.SetReadDeadline(time.Now().Add(time.Minute))
			var got bytes.Buffer
			buf := make([]byte, 3*readBufferSize)
			for {
				n, err := c.Read(buf[:min(len(buf), writeSize(rng, len(buf)))])
				got.Write(buf[:n])
				if c.r == c.w && c.pooled != nil {
					t.Fatal("holds a pooled buffer with nothing left in it")
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("after %d bytes: %v", got.Len(), err)
				}
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("read %d bytes, not the %d written", got.Len(), len(want))
			}
			if cc, ok := b.(*countingConn); ok && cc.n != len(want) {
				t.Errorf("the wrapper's Read read %d bytes of %d", cc.n, len(want))
			}
		})
	}
}

// TestConnReaderErrors checks what a read returns at a read deadline and
// after the conn was closed: the errors of the conn's own Read.
func TestConnReaderErrors(t *testing.T) {
	for _, tr := range readerTransports {
		t.Run(tr.name, func(t *testing.T) {
			a, b := tr.conns(t)
			t.Cleanup(func() { a.Close(); b.Close() })
			c := newConnReader(b)
			b.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			var p [8]byte
			_, err := c.Read(p[:])
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("read past the deadline: %v, want a timeout", err)
			}
			var oe *net.OpError
			if errors.As(err, &oe) && oe.Op != "read" {
				t.Errorf("read past the deadline: op %q, want read", oe.Op)
			}
			b.SetReadDeadline(time.Time{})
			go a.Write([]byte("x"))
			if n, err := c.Read(p[:]); n != 1 || err != nil {
				t.Fatalf("read after the deadline was lifted: %d, %v", n, err)
			}
			b.Close()
			if _, err := c.Read(p[:]); !errors.Is(err, net.ErrClosed) && !(tr.name == "pipe" && err == io.ErrClosedPipe) {
				t.Errorf("read of a closed conn: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestConnReaderWaitsWithoutBuffer checks that readers waiting for their
// peers hold no read buffer: 1000 of them cost well under a buffer each.
func TestConnReaderWaitsWithoutBuffer(t *testing.T) {
	const n = 1000
	for _, tr := range []transport{readerTransports[0], readerTransports[1]} {
		t.Run(tr.name, func(t *testing.T) {
			conns := make([]net.Conn, 0, 2*n)
			t.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			for range n {
				a, b := tr.conns(t)
				conns = append(conns, a, b)
			}
			before := heapAfterGC()
			first := make(chan struct{}, n)
			done := make(chan struct{}, n)
			for i := range n {
				a, b := conns[2*i], conns[2*i+1]
				c := newConnReader(b)
				// A first burst, read, then a wait for the next one.
				go a.Write([]byte("hello"))
				go func() {
					defer func() { done <- struct{}{} }()
					var p [8]byte
					for i := 0; ; i++ {
						if _, err := c.Read(p[:]); err != nil {
							return
						}
						if i == 0 {
							first <- struct{}{}
						}
					}
				}()
			}
			for range n {
				<-first
			}
			// The readers read their bursts and wait (or are about to):
			// the heap holds their readers, not buffers.
			per := (heapAfterGC() - before) / n
			t.Logf("%d B per waiting reader", per)
			if per >= readBufferSize/2 {
				t.Errorf("%d B per waiting reader: it holds its buffer", per)
			}
			for _, c := range conns {
				c.Close()
			}
			for range n {
				<-done
			}
		})
	}
}

func heapAfterGC() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestConnReaderDataBeforeError: bytes that came with an error are given
// first, the error after them, once; a read of nothing in between gives
// neither.
func TestConnReaderDataBeforeError(t *testing.T) {
	c := newConnReader(iotest.DataErrReader(strings.NewReader("hello, world")))
	var p [5]byte
	var got []byte
	for {
		if n, err := c.Read(nil); n != 0 || (err != nil && c.r < c.w) {
			t.Fatalf("Read(nil) = %d, %v with %d bytes buffered", n, err, c.w-c.r)
		}
		n, err := c.Read(p[:])
		got = append(got, p[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != "hello, world" {
		t.Fatalf("read %q", got)
	}
}
