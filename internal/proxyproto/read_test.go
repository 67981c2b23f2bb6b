package proxyproto

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestReadMalformed(t *testing.T) {
	long := "PROXY UNKNOWN " + strings.Repeat("a", 200) + "\r\n"
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		// Version 1.
		{"v1 too long", []byte(long), ErrMalformed},
		{"v1 too long, TCP4", []byte("PROXY TCP4 " + strings.Repeat("1", 120) + "\r\n"), ErrMalformed},
		{"v1 108 bytes", []byte("PROXY UNKNOWN " + strings.Repeat("f", 92) + "\r\n"), ErrMalformed},
		{"v1 LF without CR", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"), ErrMalformed},
		{"v1 CR without LF", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rGET / HTTP/1.1\r\n"), ErrMalformed},
		{"v1 no CRLF, then end", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2"), io.ErrUnexpectedEOF},
		{"v1 CR, then end", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r"), io.ErrUnexpectedEOF},
		{"v1 signature alone, then end", []byte("PROXY "), io.ErrUnexpectedEOF},
		{"v1 bad IPv4", []byte("PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 IPv4 octet 256", []byte("PROXY TCP4 256.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 IPv4 leading zero", []byte("PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 bad IPv6", []byte("PROXY TCP6 2001:db8:::1 2001:db8::2 1 2\r\n"), ErrMalformed},
		{"v1 host name", []byte("PROXY TCP4 localhost 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 IPv6 in TCP4", []byte("PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 IPv4 in TCP6", []byte("PROXY TCP6 1.2.3.4 2001:db8::2 1 2\r\n"), ErrMalformed},
		{"v1 IPv4 destination in TCP6", []byte("PROXY TCP6 2001:db8::1 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 mapped in TCP4", []byte("PROXY TCP4 ::ffff:1.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 zone", []byte("PROXY TCP6 fe80::1%eth0 fe80::2 1 2\r\n"), ErrMalformed},
		{"v1 port 65536", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n"), ErrMalformed},
		{"v1 port 99999", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n"), ErrMalformed},
		{"v1 port +80", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 +80 2\r\n"), ErrMalformed},
		{"v1 port -1", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n"), ErrMalformed},
		{"v1 port 0080", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 0080 2\r\n"), ErrMalformed},
		{"v1 port 0x50", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 0x50 2\r\n"), ErrMalformed},
		{"v1 port 8_0", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 8_0 2\r\n"), ErrMalformed},
		{"v1 empty port", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 \r\n"), ErrMalformed},
		{"v1 two spaces after PROXY", []byte("PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 two spaces between addresses", []byte("PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 trailing space", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n"), ErrMalformed},
		{"v1 tab", []byte("PROXY TCP4 1.2.3.4\t5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 five fields", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n"), ErrMalformed},
		{"v1 seven fields", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n"), ErrMalformed},
		{"v1 no protocol", []byte("PROXY \r\n"), ErrMalformed},
		{"v1 protocol UDP4", []byte("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 protocol tcp4", []byte("PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 UNKNOWNX", []byte("PROXY UNKNOWNX\r\n"), ErrMalformed},
		{"v1 NUL", []byte("PROXY TCP4 1.2.3.4\x00 5.6.7.8 1 2\r\n"), ErrMalformed},
		// Not a signature: lower case, or no space after PROXY.
		{"v1 lower case", []byte("proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrNoProxyHeader},
		{"v1 PROXYTCP4", []byte("PROXYTCP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrNoProxyHeader},

		// Version 2.
		{"v2 version 1", v2(0x11, 0x11, make([]byte, 12)...), ErrMalformed},
		{"v2 version 3", v2(0x31, 0x11, make([]byte, 12)...), ErrMalformed},
		{"v2 version 0", v2(0x01, 0x11, make([]byte, 12)...), ErrMalformed},
		{"v2 command 2", v2(0x22, 0x11, make([]byte, 12)...), ErrMalformed},
		{"v2 command 15", v2(0x2f, 0x00), ErrMalformed},
		{"v2 family 4", v2(0x21, 0x41, make([]byte, 12)...), ErrMalformed},
		{"v2 transport 3", v2(0x21, 0x13, make([]byte, 12)...), ErrMalformed},
		{"v2 AF_UNSPEC with a transport", v2(0x21, 0x01), ErrMalformed},
		{"v2 AF_INET with no transport", v2(0x21, 0x10, make([]byte, 12)...), ErrMalformed},
		{"v2 PROXY over UDP", v2(0x21, 0x12, make([]byte, 12)...), ErrMalformed},
		{"v2 PROXY over UDP6", v2(0x21, 0x22, make([]byte, 36)...), ErrMalformed},
		{"v2 AF_INET length 11", v2(0x21, 0x11, make([]byte, 11)...), ErrMalformed},
		{"v2 AF_INET length 0", v2(0x21, 0x11), ErrMalformed},
		{"v2 AF_INET6 length 35", v2(0x21, 0x21, make([]byte, 35)...), ErrMalformed},
		{"v2 AF_INET6 length 12", v2(0x21, 0x21, make([]byte, 12)...), ErrMalformed},
		{"v2 AF_UNIX length 215", v2(0x21, 0x31, make([]byte, 215)...), ErrMalformed},
		{"v2 LOCAL AF_INET length 0", v2(0x20, 0x11), ErrMalformed},
		{"v2 truncated TLV header", v2(0x21, 0x11, append(make([]byte, 12), 0x04, 0x00)...), ErrMalformed},
		{"v2 TLV longer than the header", v2(0x21, 0x11, append(make([]byte, 12), 0x04, 0x00, 0x02, 0x00)...), ErrMalformed},
		{"v2 signature cut", v2Local[:7], io.ErrUnexpectedEOF},
		{"v2 signature alone", v2Local[:12], io.ErrUnexpectedEOF},
		{"v2 fixed part cut", v2Local[:15], io.ErrUnexpectedEOF},
		{"v2 body cut", v2IPv4[:20], io.ErrUnexpectedEOF},
		{"v2 body missing", v2IPv4[:16], io.ErrUnexpectedEOF},
		{"v2 TLVs cut", v2IPv4[:len(v2IPv4)-1], io.ErrUnexpectedEOF},
		{"v2 signature wrong at its end", append(bytes.Clone(sigV2[:11]), 'X'), ErrNoProxyHeader},
	}
	for _, tt := range tests {
		h, rest, err := readBytes(tt.in)
		if !errors.Is(err, tt.want) || h != nil {
			t.Errorf("%s: Read(%q) = %s, %v; want nil, %v", tt.name, tt.in, describe(h), err, tt.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), "proxyproto: ") {
			t.Errorf("%s: error %q has no proxyproto: prefix", tt.name, err)
		}
		if tt.want == io.ErrUnexpectedEOF && errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v is both malformed and cut short", tt.name, err)
		}
		if tt.want == ErrNoProxyHeader && !bytes.Equal(rest, tt.in) {
			t.Errorf("%s: no header, yet Read consumed %d bytes", tt.name, len(tt.in)-len(rest))
		}
		if tt.in[0] == 'P' && len(tt.in)-len(rest) > maxV1Len {
			t.Errorf("%s: Read consumed %d bytes, more than a version 1 header", tt.name, len(tt.in)-len(rest))
		}
	}
}

// Read never consumes more than a version 1 header may take, even from a
// stream that goes on.
func TestReadV1Bounded(t *testing.T) {
	in := "PROXY TCP4 " + strings.Repeat("1", 500) + "\r\n"
	br := bufio.NewReader(strings.NewReader(in))
	if _, err := Read(br); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Read = %v, want ErrMalformed", err)
	}
	rest, _ := io.ReadAll(br)
	if consumed := len(in) - len(rest); consumed != maxV1Len {
		t.Errorf("Read consumed %d bytes, want %d", consumed, maxV1Len)
	}
}

// Read works with the smallest bufio.Reader, whose buffer is smaller than a
// header, and leaves the bytes after the header.
func TestReadSmallBuffer(t *testing.T) {
	v1 := "PROXY TCP6 2001:db8::1 2001:db8::11 56324 443\r\n"
	for _, in := range [][]byte{[]byte(v1), v2IPv4, v2IPv6} {
		br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(in), strings.NewReader("payload")), 16)
		if br.Size() != 16 {
			t.Fatalf("bufio.Reader of size %d", br.Size())
		}
		h, err := Read(br)
		if err != nil {
			t.Fatalf("Read(%q): %v", in, err)
		}
		rest, _ := io.ReadAll(br)
		if !h.Source.IsValid() || string(rest) != "payload" {
			t.Errorf("Read(%q) = %s, left %q", in, describe(h), rest)
		}
	}
}

func TestReadEmpty(t *testing.T) {
	h, _, err := readBytes(nil)
	if !errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || h != nil {
		t.Errorf("Read of nothing = %s, %v; want io.EOF", describe(h), err)
	}
}

// Read decides that there is no header on the first byte that differs from
// both signatures, and never reads a byte it does not need: it would have
// waited for a silent client.
func TestReadNoHeaderPrompt(t *testing.T) {
	tests := []struct {
		name   string
		chunks [][]byte
	}{
		{"HTTP", [][]byte{[]byte("GET / HTTP/1.1\r\n")}},
		{"HTTP, one byte", [][]byte{[]byte("G")}},
		{"TLS record", [][]byte{{0x16}}},
		{"TLS record, more", [][]byte{{0x16, 0x03, 0x01, 0x02, 0x00}}},
		{"SSH banner", [][]byte{[]byte("SSH-2.0-OpenSSH_9.6\r\n")}},
		{"HTTP/2 preface", bytewise("PRI")},
		{"WebDAV PROPFIND", bytewise("PROP")},
		{"PROXY lower case", bytewise("p")},
		{"PROXY without its space", bytewise("PROXY\r")},
		{"CRLF CRLF, then not version 2", bytewise("\r\n\r\nX")},
		{"version 2 signature, last byte wrong", append(bytewise(string(sigV2[:11])), []byte{'\r'})},
		{"empty read, then a byte", [][]byte{{}, []byte("G")}},
	}
	for _, tt := range tests {
		all := bytes.Join(tt.chunks, nil)
		sr := &scriptReader{tb: t, chunks: tt.chunks}
		br := bufio.NewReader(sr)
		h, err := Read(br)
		if !errors.Is(err, ErrNoProxyHeader) || h != nil {
			t.Errorf("%s: Read = %s, %v; want ErrNoProxyHeader", tt.name, describe(h), err)
			continue
		}
		delivered := all[:len(all)-len(bytes.Join(sr.chunks, nil))]
		if got, _ := br.Peek(br.Buffered()); !bytes.Equal(got, delivered) {
			t.Errorf("%s: after Read, the reader holds %q, want every byte it read, %q", tt.name, got, delivered)
		}
	}
}

// A header sent one byte at a time is read without reading past it.
func TestReadBytewise(t *testing.T) {
	v1 := "PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
	for _, in := range []string{v1, string(v2IPv4), string(v2IPv6), string(v2Local)} {
		sr := &scriptReader{tb: t, chunks: bytewise(in)}
		h, err := Read(bufio.NewReader(sr))
		if err != nil || h == nil {
			t.Errorf("Read(%q) byte by byte: %v", in, err)
		}
		if sr.reads != len(in) {
			t.Errorf("Read(%q) byte by byte: %d reads, want %d", in, sr.reads, len(in))
		}
	}
}

// Over net.Pipe and loopback TCP, a client that sends the first bytes of
// something else and then waits gets ErrNoProxyHeader at once, and the bytes
// stay in the reader.
func TestReadNoHeaderConn(t *testing.T) {
	type pair struct {
		name           string
		client, server net.Conn
	}
	pipeClient, pipeServer := net.Pipe()
	t.Cleanup(func() { pipeClient.Close(); pipeServer.Close() })
	tcpClient, tcpServer := tcpPair(t)
	for _, p := range []pair{{"pipe", pipeClient, pipeServer}, {"tcp", tcpClient, tcpServer}} {
		for _, first := range []string{"GET /", "\x16\x03\x01", "SSH-2.0-"} {
			written := make(chan error, 1)
			go func() { _, err := p.client.Write([]byte(first)); written <- err }()
			guard(t, p.server) // a wait shows as ErrTimeout, not a hang
			br := bufio.NewReader(p.server)
			_, err := Read(br)
			if !errors.Is(err, ErrNoProxyHeader) {
				t.Fatalf("%s, %q: Read = %v, want ErrNoProxyHeader", p.name, first, err)
			}
			if werr := <-written; werr != nil {
				t.Fatal(werr)
			}
			// Take the bytes out, for the next round.
			got := make([]byte, len(first))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != first {
				t.Errorf("%s: the reader holds %q, %v; want %q", p.name, got, err, first)
			}
		}
	}
}

// A header whose end does not come in time fails with ErrTimeout, a
// net.Error.
func TestReadTimeout(t *testing.T) {
	for _, first := range []string{"PRO", "PROXY TCP4 1.2.", string(v2IPv4[:20])} {
		client, server := tcpPair(t)
		if _, err := client.Write([]byte(first)); err != nil {
			t.Fatal(err)
		}
		server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := Read(bufio.NewReader(server))
		var ne net.Error
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("%q then silence: Read = %v, want ErrTimeout, a net.Error with Timeout", first, err)
		}
	}
}

// A header cut by the client closing fails with io.ErrUnexpectedEOF; a
// conn closed before any byte, with io.EOF.
func TestReadClosed(t *testing.T) {
	for _, first := range []string{"", "PROX", "PROXY TCP4 1.2.3.4", string(v2IPv4[:13])} {
		client, server := tcpPair(t)
		client.Write([]byte(first))
		client.CloseWrite()
		guard(t, server)
		_, err := Read(bufio.NewReader(server))
		want := io.ErrUnexpectedEOF
		if first == "" {
			want = io.EOF
		}
		if !errors.Is(err, want) || want == io.EOF && errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q then close: Read = %v, want %v", first, err, want)
		}
	}
}

// errReader fails every Read.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestReadOtherError(t *testing.T) {
	errBoom := errors.New("boom")
	_, err := Read(bufio.NewReader(errReader{errBoom}))
	if !errors.Is(err, errBoom) || !strings.HasPrefix(err.Error(), "proxyproto: ") {
		t.Errorf("Read = %v, want a proxyproto: error wrapping the reader's", err)
	}
	_, err = Read(bufio.NewReader(io.MultiReader(strings.NewReader("PROXY TC"), errReader{errBoom})))
	if !errors.Is(err, errBoom) {
		t.Errorf("Read = %v, want it to wrap the reader's error", err)
	}
}
