package sni

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func BenchmarkParse(b *testing.B) {
	rec := goHello(b)
	b.SetBytes(int64(len(rec)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(rec); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseReframed(b *testing.B) {
	stream := reframe(handshakeMsg(b, goHello(b)), 100)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(stream); err != nil {
			b.Fatal(err)
		}
	}
}

// The loopback benchmarks below compare Peek with a plain Read of the same
// bytes on the same kind of conn. Each iteration the client writes the bytes
// on an established loopback TCP conn and the server side either Peeks or
// Reads them; both pay the same write and read system calls, so the
// difference is Peek's own cost (deadline, buffer, parsing, the Conn).

var httpRequest = []byte("GET / HTTP/1.1\r\nHost: app.example.test\r\nUser-Agent: bench\r\n\r\n")

func BenchmarkPeekNotTLS(b *testing.B) {
	client, server := tcpPair(b)
	benchPeek(b, client, server, httpRequest, func(h *ClientHello, err error) bool {
		return errors.Is(err, ErrNotTLS)
	})
}

func BenchmarkReadBaselineNotTLS(b *testing.B) {
	client, server := tcpPair(b)
	benchRead(b, client, server, httpRequest)
}

// BenchmarkReadBaselineNotTLSDeadline is the baseline plus setting and
// clearing a read deadline, which any bounded read pays: it shows how much of
// Peek's cost is the deadline (on some systems, a timer change wakes the idle
// network poller with a system call).
func BenchmarkReadBaselineNotTLSDeadline(b *testing.B) {
	client, server := tcpPair(b)
	benchReadDeadline(b, client, server, httpRequest)
}

func BenchmarkPeekHello(b *testing.B) {
	client, server := tcpPair(b)
	benchPeek(b, client, server, goHello(b), func(h *ClientHello, err error) bool {
		return err == nil && h.ServerName == appName
	})
}

func BenchmarkReadBaselineHello(b *testing.B) {
	client, server := tcpPair(b)
	benchRead(b, client, server, goHello(b))
}

// BenchmarkReadBaselineHelloDeadline is BenchmarkReadBaselineHello plus
// setting and clearing a read deadline, as Peek does.
func BenchmarkReadBaselineHelloDeadline(b *testing.B) {
	client, server := tcpPair(b)
	benchReadDeadline(b, client, server, goHello(b))
}

func benchPeek(b *testing.B, client, server net.Conn, msg []byte, ok func(*ClientHello, error) bool) {
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := client.Write(msg); err != nil {
			b.Fatal(err)
		}
		// Peek reads what it needs, which here is all of msg: the
		// returned conn would replay it; the benchmark drops it.
		h, _, err := Peek(server)
		if !ok(h, err) {
			b.Fatal(h, err)
		}
	}
}

func benchRead(b *testing.B, client, server net.Conn, msg []byte) {
	buf := make([]byte, firstReadSize)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := client.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(server, buf[:len(msg)]); err != nil {
			b.Fatal(err)
		}
	}
}

func benchReadDeadline(b *testing.B, client, server net.Conn, msg []byte) {
	buf := make([]byte, firstReadSize)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := client.Write(msg); err != nil {
			b.Fatal(err)
		}
		server.SetReadDeadline(time.Now().Add(DefaultTimeout))
		if _, err := io.ReadFull(server, buf[:len(msg)]); err != nil {
			b.Fatal(err)
		}
		server.SetReadDeadline(time.Time{})
	}
}
