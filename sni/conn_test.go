package sni

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// CloseWrite on the conn Peek returns reaches the peer, which reads EOF and
// can still send.
func TestConnCloseWrite(t *testing.T) {
	testwait.NoLeak(t, 0)
	client, server := tcpPair(t)
	client.Write([]byte("PING"))
	_, conn, err := Peek(server)
	if !errors.Is(err, ErrNotTLS) {
		t.Fatal(err)
	}
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("%T has no CloseWrite", conn)
	}
	conn.Write([]byte("PONG"))
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, client); string(got) != "PONG" {
		t.Errorf("client read %q then EOF, want PONG", got)
	}
	// The other direction is still open.
	client.Write([]byte(" after"))
	client.CloseWrite()
	if got := readAll(t, conn); string(got) != "PING after" {
		t.Errorf("server read %q, want %q", got, "PING after")
	}
}

func TestConnCloseWriteUnsupported(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	err := NewConn(a, nil).CloseWrite()
	if !errors.Is(err, errors.ErrUnsupported) || !strings.HasPrefix(err.Error(), "sni: ") {
		t.Errorf("CloseWrite over net.Pipe: %v, want an sni: error wrapping errors.ErrUnsupported", err)
	}
}

// spyConn records which copy paths were taken.
type spyConn struct {
	net.Conn
	wroteTo, readFrom bool
}

func (c *spyConn) WriteTo(w io.Writer) (int64, error) {
	c.wroteTo = true
	return io.Copy(w, struct{ io.Reader }{c.Conn})
}

func (c *spyConn) ReadFrom(r io.Reader) (int64, error) {
	c.readFrom = true
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// io.Copy from a Conn uses its WriteTo, which writes the prefix and then
// hands the underlying conn to io.Copy, so its WriteTo (or the
// destination's ReadFrom) runs: for *net.TCPConn, the splice path.
func TestConnWriteTo(t *testing.T) {
	testwait.NoLeak(t, 0)
	client, server := tcpPair(t)
	spy := &spyConn{Conn: server}
	conn := NewConn(spy, []byte("prefix,"))
	client.Write([]byte("rest"))
	client.CloseWrite()
	var got bytes.Buffer
	n, err := io.Copy(&got, conn)
	if err != nil || got.String() != "prefix,rest" || n != int64(got.Len()) {
		t.Errorf("io.Copy: %d, %v, %q; want prefix,rest", n, err, got.String())
	}
	if !spy.wroteTo {
		t.Error("the underlying conn's WriteTo was not used")
	}

	// The other direction: io.Copy to a Conn uses the underlying ReadFrom
	// (for a source without a WriteTo method of its own).
	n, err = io.Copy(conn, struct{ io.Reader }{strings.NewReader("reply")})
	if err != nil || n != 5 || !spy.readFrom {
		t.Errorf("io.Copy to the conn: %d, %v, ReadFrom used %v", n, err, spy.readFrom)
	}
	server.CloseWrite()
	if got := readAll(t, client); string(got) != "reply" {
		t.Errorf("client read %q", got)
	}
}

// A Conn from Peek, copied to another TCP conn: the whole stream arrives.
func TestConnCopyTCPToTCP(t *testing.T) {
	testwait.NoLeak(t, 0)
	client, server := tcpPair(t)
	backendIn, backendOut := tcpPair(t)
	stream := append(bytes.Clone(goHello(t)), bytes.Repeat([]byte("data"), 64<<10)...)
	done := make(chan error, 1)
	go func() {
		_, err := client.Write(stream)
		client.CloseWrite()
		done <- err
	}()
	h, conn, err := Peek(server)
	if err != nil || h.ServerName != appName {
		t.Fatal(h, err)
	}
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(backendIn, conn)
		backendIn.CloseWrite()
		copied <- err
	}()
	got := readAll(t, backendOut)
	if err := <-copied; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, stream) {
		t.Errorf("backend got %d bytes, want %d, identical", len(got), len(stream))
	}
}

// A short write of the prefix keeps the unwritten rest for later.
func TestConnWriteToShortWrite(t *testing.T) {
	conn := NewConn(newScript(t, io.EOF, []byte("tail")), []byte("0123456789"))
	n, err := conn.WriteTo(&shortWriter{max: 4})
	if n != 4 || !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("WriteTo: %d, %v; want 4, io.ErrShortWrite", n, err)
	}
	if got := readAll(t, conn); string(got) != "456789tail" {
		t.Errorf("after a short write: %q", got)
	}
}

type shortWriter struct{ max int }

func (w *shortWriter) Write(p []byte) (int, error) { return min(len(p), w.max), nil }

// Deadlines pass through to the underlying conn; the prefix is returned
// whatever the deadline.
func TestConnDeadlines(t *testing.T) {
	testwait.NoLeak(t, 0)
	client, server := tcpPair(t)
	conn := NewConn(server, []byte("pre"))
	if err := conn.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if n, err := conn.Read(buf); n != 3 || err != nil {
		t.Errorf("prefix read past the deadline: %d, %v; want 3, nil", n, err)
	}
	if _, err := conn.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	conn.SetDeadline(time.Time{})
	client.Write([]byte("x"))
	if n, err := conn.Read(buf); n != 1 || err != nil {
		t.Errorf("read after clearing: %d, %v", n, err)
	}
	if err := conn.SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("write past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if conn.LocalAddr().String() != server.LocalAddr().String() || conn.RemoteAddr().String() != client.LocalAddr().String() {
		t.Errorf("addresses %v, %v", conn.LocalAddr(), conn.RemoteAddr())
	}
}

// NewConn replaces the first bytes: the reader sees the new prefix, then the
// rest of the conn.
func TestNewConnReplacesBytes(t *testing.T) {
	under := newScript(t, io.EOF, []byte(" world"))
	conn := NewConn(under, []byte("hello"))
	var got []byte
	buf := make([]byte, 2) // small reads split the prefix
	for {
		n, err := conn.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != "hello world" {
		t.Errorf("%q", got)
	}
	if NewConn(under, []byte{}).prefix != nil {
		t.Error("an empty prefix is kept")
	}
}

func TestConnClose(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	conn := NewConn(a, []byte("unread"))
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 8)); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("read after Close: %v, want the closed conn's error", err)
	}
}

// Concurrent reads, writes and copies are free of data races (run with
// -race); the bytes are all delivered once.
func TestConnConcurrent(t *testing.T) {
	testwait.NoLeak(t, 0)
	client, server := tcpPair(t)
	conn := NewConn(server, bytes.Repeat([]byte("p"), 1000))
	client.Write(bytes.Repeat([]byte("q"), 1000))
	client.CloseWrite()
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 7)
			for {
				n, err := conn.Read(buf)
				mu.Lock()
				total += n
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn.Write([]byte("w"))
	}()
	wg.Wait()
	if total != 2000 {
		t.Errorf("read %d bytes, want 2000", total)
	}
}
