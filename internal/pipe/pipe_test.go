package pipe

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// halfClose joins client<->proxy<->server with join: the client sends
// payload and half-closes, and once the server read it all, the server
// sends reply and closes. It returns what the client got back after its
// half-close, and what join counted each way.
func halfClose(t *testing.T, join func(a, b net.Conn) (int64, int64, error), payload, reply []byte) (back []byte, counted [2]int64) {
	t.Helper()
	client, proxyIn := tcpPair(t)
	proxyOut, server := tcpPair(t)
	done := make(chan [2]int64, 1)
	go func() {
		in, out, _ := join(proxyIn, proxyOut)
		done <- [2]int64{in, out}
	}()
	go func() {
		client.Write(payload)
		client.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("server got %d bytes, %v", len(got), err)
	}
	server.Write(reply)
	server.Close()
	back, err = io.ReadAll(client)
	if err != nil {
		t.Fatalf("client got %d bytes after its half-close, %v", len(back), err)
	}
	return back, <-done
}

// TestHalfClose joins client<->proxy<->server: the client half-closes, and
// every byte the server sends afterwards still reaches it.
func TestHalfClose(t *testing.T) {
	for name, join := range map[string]func(a, b net.Conn) (int64, int64, error){
		"Join":        Join,
		"JoinStreams": func(a, b net.Conn) (int64, int64, error) { return JoinStreams(a, b, time.Minute) },
	} {
		t.Run(name, func(t *testing.T) {
			payload := bytes.Repeat([]byte("abc"), 100000)
			reply := bytes.Repeat([]byte("after EOF;"), 50000)
			back, n := halfClose(t, join, payload, reply)
			if !bytes.Equal(back, reply) {
				t.Fatalf("client got %d of %d bytes after its half-close", len(back), len(reply))
			}
			if n != [2]int64{int64(len(payload)), int64(len(reply))} {
				t.Fatalf("counted %v", n)
			}
		})
	}
}

func TestJoinStreamsIdleTimeout(t *testing.T) {
	client, proxyIn := tcpPair(t)
	proxyOut, server := tcpPair(t)
	done := make(chan struct{})
	go func() { JoinStreams(proxyIn, proxyOut, 50*time.Millisecond); close(done) }()
	// Some traffic, then silence: the pair is closed, both ends see EOF.
	client.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an idle pair was not closed")
	}
	for _, c := range []net.Conn{client, server} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(buf); err != io.EOF {
			t.Errorf("after the idle timeout: %v, want EOF", err)
		}
	}
}

// TestObserve joins two observed conns: each observer sees every byte its
// side read, in order; the bytes end returns reach the other side before
// its EOF, and are seen too; half-closes pass through.
func TestObserve(t *testing.T) {
	var sawIn, sawOut bytes.Buffer
	ends := 0
	join := func(a, b net.Conn) (int64, int64, error) {
		in := Observe(a, func(p []byte) { sawIn.Write(p) }, nil)
		out := Observe(b, func(p []byte) { sawOut.Write(p) }, func() []byte { ends++; return []byte("the end") })
		return JoinStreams(in, out, 0)
	}
	payload := bytes.Repeat([]byte("abc"), 100000)
	reply := bytes.Repeat([]byte("reply;"), 50000)
	back, n := halfClose(t, join, payload, reply)
	want := append(bytes.Clone(reply), "the end"...)
	if !bytes.Equal(back, want) {
		t.Fatalf("client got %d of %d bytes, ending %q", len(back), len(want), back[max(0, len(back)-10):])
	}
	if n != [2]int64{int64(len(payload)), int64(len(want))} {
		t.Errorf("counted %v", n)
	}
	if !bytes.Equal(sawIn.Bytes(), payload) || !bytes.Equal(sawOut.Bytes(), want) || ends != 1 {
		t.Errorf("observed %d and %d bytes, end called %d times; want %d, %d, once", sawIn.Len(), sawOut.Len(), ends, len(payload), len(want))
	}
}

// TestQueue hands conns to a Queue's Accept, and closes it: a Push then
// fails, and Accept returns net.ErrClosed.
func TestQueue(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	q := NewQueue(addr)
	if q.Addr() != addr {
		t.Errorf("Addr() = %v, want %v", q.Addr(), addr)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	pushed := make(chan bool, 1)
	go func() { pushed <- q.Push(a) }()
	if c, err := q.Accept(); c != a || err != nil {
		t.Fatalf("Accept() = %v, %v; want the conn pushed", c, err)
	}
	if !<-pushed {
		t.Error("Push reported false before Close")
	}
	q.Close()
	q.Close()
	if q.Push(b) {
		t.Error("Push after Close reported true")
	}
	if _, err := q.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	select {
	case <-q.Done():
	default:
		t.Error("Done not closed after Close")
	}
}
