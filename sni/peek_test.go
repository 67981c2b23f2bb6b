package sni

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// segmentName makes Go's default hello 1521 bytes, the size in the field
// notes: more than one 1460-byte TCP segment.
const segmentName = "segment-test.app.example.test"

// wantReplay checks that conn yields want, then the rest of the stream, by
// reading len(want) bytes.
func wantReplay(t *testing.T, conn net.Conn, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("replay differs from the bytes sent:\n got % x\nwant % x", got[:min(len(got), 32)], want[:min(len(want), 32)])
	}
}

// peekResult is what Peek returned, for tests that run it in a goroutine.
type peekResult struct {
	hello *ClientHello
	conn  net.Conn
	err   error
}

func goPeek(p *Peeker, conn net.Conn) <-chan peekResult {
	ch := make(chan peekResult, 1)
	go func() {
		h, c, err := p.Peek(conn)
		ch <- peekResult{h, c, err}
	}()
	return ch
}

// A hello larger than one segment: 1460 bytes, a pause, then the rest. Peek
// must ask for more after the first segment and return once the rest is in.
func TestPeekHelloOverTwoSegments(t *testing.T) {
	testwait.NoLeak(t, 0)
	rec := captureHello(t, &tls.Config{ServerName: segmentName})
	t.Logf("Go default ClientHello for %s: %d bytes", segmentName, len(rec))
	if len(rec) <= 1460 {
		t.Fatalf("hello of %d bytes fits in one segment", len(rec))
	}
	client, server := tcpPair(t)
	hooked := newHookConn(server)
	result := goPeek(nil, hooked)

	if _, err := client.Write(rec[:1460]); err != nil {
		t.Fatal(err)
	}
	// Wait until Peek has some of the bytes and asks for more: a second
	// Read begins. Whatever it got, the hello is incomplete without the
	// rest, so Peek must still be waiting when we look.
	<-hooked.reads // the first Read
	<-hooked.reads // a second Read: the first returned, and Peek wants more
	select {
	case r := <-result:
		t.Fatalf("Peek returned before the second segment: %v, %v", r.hello, r.err)
	default:
	}
	if _, err := client.Write(rec[1460:]); err != nil {
		t.Fatal(err)
	}
	r := <-result
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.hello.ServerName != segmentName {
		t.Errorf("ServerName %q, want %q", r.hello.ServerName, segmentName)
	}
	wantReplay(t, r.conn, rec)
}

// The same over a scripted conn: the second Read is where Peek must wait.
func TestPeekScriptedSegments(t *testing.T) {
	rec := captureHello(t, &tls.Config{ServerName: segmentName})
	for name, chunks := range map[string][][]byte{
		"1460 then the rest": {rec[:1460], rec[1460:]},
		"1 byte at a time":   chunked(rec, 1),
		"7 bytes at a time":  chunked(rec, 7),
		"header in pieces":   {rec[:1], rec[1:3], rec[3:5], rec[5:6], rec[6:]},
	} {
		t.Run(name, func(t *testing.T) {
			c := newScript(t, nil, chunks...)
			h, conn, err := Peek(c)
			if err != nil {
				t.Fatal(err)
			}
			if h.ServerName != segmentName {
				t.Errorf("ServerName %q", h.ServerName)
			}
			if c.reads != len(chunks) {
				t.Errorf("%d reads for %d chunks", c.reads, len(chunks))
			}
			wantReplay(t, conn, rec)
		})
	}
}

// A hello without server_name is a success with an empty name, and one
// with a name to normalise is normalised, through Peek as through Parse.
func TestPeekNames(t *testing.T) {
	for raw, want := range map[string]string{
		"":             "",
		"Example.COM.": "example.com",
	} {
		exts := []ext{alpnExt("h2")}
		if raw != "" {
			exts = append(exts, sniExt(raw))
		}
		rec := record(buildHello(exts...))
		h, conn, err := Peek(newScript(t, nil, chunked(rec, 10)...))
		if err != nil || h.ServerName != want || h.RawServerName != raw {
			t.Errorf("%q: %+v, %v; want %q", raw, h, err, want)
			continue
		}
		wantReplay(t, conn, rec)
	}
}

// One byte per Read over real TCP: the writer sends the next byte only once
// Peek is reading again.
func TestPeekOneByteAtATimeTCP(t *testing.T) {
	testwait.NoLeak(t, 0)
	rec := goHello(t)
	client, server := tcpPair(t)
	hooked := newHookConn(server)
	result := goPeek(nil, hooked)
	for i := range rec {
		<-hooked.reads
		select {
		case r := <-result:
			t.Fatalf("Peek returned after %d of %d bytes: %v", i, len(rec), r.err)
		default:
		}
		if _, err := client.Write(rec[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	r := <-result
	if r.err != nil || r.hello.ServerName != appName {
		t.Fatalf("%v, %v", r.hello, r.err)
	}
	wantReplay(t, r.conn, rec)
}

// Hellos re-framed into many records, sent in arbitrary pieces.
func TestPeekReframed(t *testing.T) {
	msg := handshakeMsg(t, goHello(t))
	host := bytes.Index(msg, []byte(appName))
	streams := map[string][]byte{
		"100-byte records":           reframe(msg, 100),
		"1-byte records":             reframe(msg, 1),
		"3-byte records":             reframe(msg, 3),
		"split in handshake header":  splitRecords(msg, 2),
		"header over three records":  splitRecords(msg, 1, 2),
		"split inside the host name": splitRecords(msg, host+5),
	}
	for name, stream := range streams {
		for _, size := range []int{1, 5, 6, 1000, len(stream)} {
			c := newScript(t, nil, chunked(stream, size)...)
			h, conn, err := Peek(c)
			if err != nil || h.ServerName != appName {
				t.Fatalf("%s in %d-byte reads: %v, %v", name, size, h, err)
			}
			if !bytes.Equal(h.Raw, msg) {
				t.Fatalf("%s: Raw is not the handshake message", name)
			}
			wantReplay(t, conn, stream)
		}
	}
	// 1-byte records over TCP, in one write.
	client, server := tcpPair(t)
	stream := streams["1-byte records"]
	client.Write(stream) // about 9 KB: the socket buffer holds it
	h, conn, err := Peek(server)
	if err != nil || h.ServerName != appName {
		t.Fatalf("1-byte records over TCP: %v, %v", h, err)
	}
	wantReplay(t, conn, stream)
}

var notTLS = map[string][]byte{
	"HTTP":           []byte("GET / HTTP/1.1\r\nHost: app.example.test\r\n\r\n"),
	"SSH":            []byte("SSH-2.0-OpenSSH_9.6\r\n"),
	"PROXY protocol": []byte("PROXY TCP4 192.0.2.1 192.0.2.2 56324 443\r\n"),
	"a lone G":       []byte("G"),
	"SSLv2 hello":    {0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10},
	"alert record":   {0x15, 0x03, 0x01, 0x00, 0x02, 0x01, 0x00},
}

// Not TLS is decided on the first byte. The scripted client is silent after
// its bytes: a second Read fails the test, as it would have waited.
func TestPeekNotTLS(t *testing.T) {
	for name, b := range notTLS {
		t.Run(name, func(t *testing.T) {
			// The worst case: the first Read returns a single byte.
			c := newScript(t, nil, b[:1], b[1:])
			h, conn, err := Peek(c)
			if !errors.Is(err, ErrNotTLS) || h != nil {
				t.Fatalf("%v, %v; want ErrNotTLS", h, err)
			}
			if c.reads != 1 {
				t.Errorf("%d reads, want 1", c.reads)
			}
			wantReplay(t, conn, b)
		})
	}
}

// Over TCP, with the default 10-second timeout, a client that sends a few
// bytes and then stays silent and open: Peek must answer at once. Were it
// waiting, it would end with a timeout, not ErrNotTLS.
func TestPeekNotTLSOverTCP(t *testing.T) {
	testwait.NoLeak(t, 0)
	for name, b := range notTLS {
		t.Run(name, func(t *testing.T) {
			client, server := tcpPair(t)
			if _, err := client.Write(b); err != nil {
				t.Fatal(err)
			}
			h, conn, err := Peek(server)
			if !errors.Is(err, ErrNotTLS) || h != nil {
				t.Fatalf("%v, %v; want ErrNotTLS", h, err)
			}
			wantReplay(t, conn, b)
			// And the conn goes on: the client's next bytes follow.
			client.Write([]byte("more"))
			wantReplay(t, conn, []byte("more"))
		})
	}
}

// A record length over 2^14 is rejected on its header, before reading the
// record, while the client stays silent.
func TestPeekRecordTooLarge(t *testing.T) {
	testwait.NoLeak(t, 0)
	b := []byte{0x16, 0x03, 0x01, 0xff, 0xff}
	c := newScript(t, nil, b)
	if _, conn, err := Peek(c); !errors.Is(err, ErrTooLarge) {
		t.Errorf("scripted: %v, want ErrTooLarge", err)
	} else {
		wantReplay(t, conn, b)
	}
	client, server := tcpPair(t)
	client.Write(b)
	if _, conn, err := Peek(server); !errors.Is(err, ErrTooLarge) {
		t.Errorf("TCP: %v, want ErrTooLarge", err)
	} else {
		wantReplay(t, conn, b)
	}
}

func TestPeekMaxBytes(t *testing.T) {
	rec := goHello(t)
	// Exactly enough, and one byte short, for one record.
	h, _, err := (&Peeker{MaxBytes: len(rec)}).Peek(newScript(t, nil, rec))
	if err != nil || h.ServerName != appName {
		t.Errorf("MaxBytes %d: %v, %v", len(rec), h, err)
	}
	// Too small: decided on the handshake header, with the client silent.
	c := newScript(t, nil, rec[:9])
	if _, conn, err := (&Peeker{MaxBytes: len(rec) - 1}).Peek(c); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxBytes %d: %v, want ErrTooLarge", len(rec)-1, err)
	} else {
		wantReplay(t, conn, rec[:9])
	}
	// A hello in 1-byte records needs six times its size: the cap counts
	// the record headers, and the buffer stops at MaxBytes.
	stream := reframe(handshakeMsg(t, rec), 1)
	c = newScript(t, io.EOF, stream)
	if _, conn, err := (&Peeker{MaxBytes: 4096}).Peek(c); !errors.Is(err, ErrTooLarge) {
		t.Errorf("%d bytes of 1-byte records, MaxBytes 4096: %v, want ErrTooLarge", len(stream), err)
	} else if got := readAll(t, conn); !bytes.Equal(got, stream) {
		t.Error("replay differs")
	}
	// A hello over 16 KiB, in two records, fails by default, on its
	// header, and passes with a larger MaxBytes.
	const padding = 21 // the padding extension, RFC 7685
	big := buildHello(sniExt(appName), ext{padding, make([]byte, 20000)})
	stream = splitRecords(big, maxRecordLen)
	if _, _, err := Peek(newScript(t, nil, stream[:20])); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a %d-byte hello: %v, want ErrTooLarge", len(big), err)
	}
	h, _, err = (&Peeker{MaxBytes: 64 << 10}).Peek(newScript(t, nil, stream))
	if err != nil || h.ServerName != appName || len(h.Raw) != len(big) {
		t.Errorf("a %d-byte hello, MaxBytes 64 KiB: %v, %v", len(big), h, err)
	}
}

// A silent client times out, with an error that is a net.Error, and leaves
// no goroutine behind. The conn is usable afterwards.
func TestPeekTimeout(t *testing.T) {
	testwait.NoLeak(t, 0)
	for name, sent := range map[string][]byte{
		"silent":        nil,
		"half a hello":  goHello(t)[:700],
		"record header": {0x16, 0x03, 0x01},
	} {
		t.Run(name, func(t *testing.T) {
			client, server := tcpPair(t)
			client.Write(sent)
			h, conn, err := (&Peeker{Timeout: 50 * time.Millisecond}).Peek(server)
			if h != nil || !errors.Is(err, ErrTimeout) || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("%v, %v; want ErrTimeout", h, err)
			}
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("%v is not a net.Error with Timeout", err)
			}
			if _, ok := err.(net.Error); !ok {
				t.Errorf("%T is not itself a net.Error", err)
			}
			// The read deadline is cleared: the rest arrives and reads.
			client.Write([]byte("late"))
			wantReplay(t, conn, append(bytes.Clone(sent), "late"...))
		})
	}
}

func TestPeekEOF(t *testing.T) {
	testwait.NoLeak(t, 0)
	rec := goHello(t)
	for name, tc := range map[string]struct {
		sent []byte
		want error
	}{
		"nothing":                  {nil, io.EOF},
		"a record header":          {[]byte{0x16, 0x03, 0x01, 0x05, 0xec}, io.ErrUnexpectedEOF},
		"a byte":                   {[]byte{0x16}, io.ErrUnexpectedEOF},
		"all but the last byte":    {rec[:len(rec)-1], io.ErrUnexpectedEOF},
		"the first of two records": {record(handshakeMsg(t, rec)[:100]), io.ErrUnexpectedEOF},
	} {
		t.Run(name, func(t *testing.T) {
			client, server := tcpPair(t)
			client.Write(tc.sent)
			client.CloseWrite()
			h, conn, err := Peek(server)
			if h != nil || !errors.Is(err, tc.want) {
				t.Fatalf("%v, %v; want %v", h, err, tc.want)
			}
			if got := readAll(t, conn); !bytes.Equal(got, tc.sent) {
				t.Errorf("replay % x, want % x", got, tc.sent)
			}
		})
	}
}

// A hello followed in the same write by a ChangeCipherSpec record: all of
// it is replayed.
func TestPeekReplaysBytesAfterHello(t *testing.T) {
	testwait.NoLeak(t, 0)
	ccs := []byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x01}
	all := append(bytes.Clone(goHello(t)), ccs...)

	h, conn, err := Peek(newScript(t, io.EOF, all))
	if err != nil || h.ServerName != appName {
		t.Fatalf("scripted: %v, %v", h, err)
	}
	if got := readAll(t, conn); !bytes.Equal(got, all) {
		t.Errorf("scripted: replay lost bytes: %d of %d", len(got), len(all))
	}

	client, server := tcpPair(t)
	client.Write(all)
	client.CloseWrite()
	h, conn, err = Peek(server)
	if err != nil || h.ServerName != appName {
		t.Fatalf("TCP: %v, %v", h, err)
	}
	if got := readAll(t, conn); !bytes.Equal(got, all) {
		t.Errorf("TCP: replay lost bytes: %d of %d", len(got), len(all))
	}
}

// Errors found part way through are reported at once, with what was read.
func TestPeekMalformed(t *testing.T) {
	msg := handshakeMsg(t, goHello(t))
	for name, b := range map[string][]byte{
		"ServerHello type":           {0x16, 0x03, 0x03, 0x00, 0x40, 0x02},
		"alert after a first record": append(record(msg[:10]), 0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28),
		"two host names":             record(buildHello(sniExt("a.example", "b.example"))),
		"record version 1.0":         {0x16, 0x01},
	} {
		c := newScript(t, nil, b)
		h, conn, err := Peek(c)
		if h != nil || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, %v; want ErrMalformed", name, h, err)
			continue
		}
		wantReplay(t, conn, b)
	}
	c := newScript(t, nil, record(buildHello(sniExt("bad name.example"))))
	if _, _, err := Peek(c); !errors.Is(err, ErrInvalidName) {
		t.Errorf("invalid name: %v, want ErrInvalidName", err)
	}
}

// Peek sets a read deadline and clears it; a negative Timeout leaves the
// deadlines alone.
func TestPeekDeadlines(t *testing.T) {
	rec := goHello(t)
	c := newScript(t, nil, rec)
	start := time.Now()
	if _, _, err := Peek(c); err != nil {
		t.Fatal(err)
	}
	if len(c.deadlines) != 2 || c.deadlines[0].Before(start.Add(DefaultTimeout)) || !c.deadlines[1].IsZero() {
		t.Errorf("deadlines set: %v; want now+%v, then zero", c.deadlines, DefaultTimeout)
	}
	c = newScript(t, nil, []byte("G"))
	if _, _, err := Peek(c); !errors.Is(err, ErrNotTLS) || len(c.deadlines) != 2 || !c.deadlines[1].IsZero() {
		t.Errorf("not TLS: %v, deadlines %v; want them cleared", err, c.deadlines)
	}
	c = newScript(t, nil, rec)
	if _, _, err := (&Peeker{Timeout: -1}).Peek(c); err != nil || len(c.deadlines) != 0 {
		t.Errorf("negative Timeout: %v, deadlines %v; want none", err, c.deadlines)
	}

	// A negative Timeout keeps the caller's deadline.
	_, server := tcpPair(t)
	server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, _, err := (&Peeker{Timeout: -1}).Peek(server); !errors.Is(err, ErrTimeout) {
		t.Errorf("caller's deadline: %v, want ErrTimeout", err)
	}
}

// A conn whose deadlines cannot be set is refused rather than read without
// a bound.
func TestPeekDeadlineError(t *testing.T) {
	c := &noDeadlineConn{newScript(t, nil)}
	_, conn, err := Peek(c)
	if err == nil || conn == nil {
		t.Fatalf("%v, %v; want an error and a conn", conn, err)
	}
	if _, _, err := (&Peeker{Timeout: -1}).Peek(&noDeadlineConn{newScript(t, nil, goHello(t))}); err != nil {
		t.Errorf("negative Timeout: %v", err)
	}
}

type noDeadlineConn struct{ *scriptConn }

func (*noDeadlineConn) SetReadDeadline(time.Time) error { return errors.ErrUnsupported }

// Other read errors are returned wrapped, with the conn.
func TestPeekReadError(t *testing.T) {
	boom := errors.New("connection reset")
	c := newScript(t, boom, []byte{0x16, 0x03})
	_, conn, err := Peek(c)
	if !errors.Is(err, boom) {
		t.Fatalf("%v, want it to wrap %v", err, boom)
	}
	wantReplay(t, conn, []byte{0x16, 0x03})

	// A conn that returns nothing, forever, is given up on.
	_, _, err = Peek(&zeroConn{newScript(t, nil)})
	if !errors.Is(err, io.ErrNoProgress) {
		t.Errorf("%v, want io.ErrNoProgress", err)
	}
}

type zeroConn struct{ *scriptConn }

func (*zeroConn) Read([]byte) (int, error) { return 0, nil }

// The error paths all return a usable conn.
func TestPeekConnNeverNil(t *testing.T) {
	for _, c := range []net.Conn{
		newScript(t, io.EOF),
		newScript(t, nil, []byte("x")),
		&noDeadlineConn{newScript(t, nil)},
	} {
		if _, conn, _ := Peek(c); conn == nil {
			t.Errorf("%T: nil conn", c)
		} else if conn.(*Conn).NetConn() != c {
			t.Errorf("%T: NetConn is not the conn peeked", c)
		}
	}
}
