package proxyproto

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
)

// writeCounter records each Write.
type writeCounter struct {
	writes [][]byte
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

// Write writes each header in one Write call, in the expected form, and Read
// reads back the expected header, consuming exactly the written bytes.
func TestWriteRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		src, dst netip.AddrPort
		v1       string // the expected version 1 line
		v2fam    byte   // the expected version 2 family
		want     Header // what Read returns, Version aside
	}{
		{
			name: "IPv4",
			src:  ap("192.0.2.1:56324"), dst: ap("198.51.100.7:443"),
			v1:    "PROXY TCP4 192.0.2.1 198.51.100.7 56324 443\r\n",
			v2fam: famTCP4,
			want:  Header{Command: Proxy, Source: ap("192.0.2.1:56324"), Destination: ap("198.51.100.7:443")},
		},
		{
			name: "IPv6",
			src:  ap("[2001:db8::1]:56324"), dst: ap("[2001:db8:ffff::2]:8443"),
			v1:    "PROXY TCP6 2001:db8::1 2001:db8:ffff::2 56324 8443\r\n",
			v2fam: famTCP6,
			want:  Header{Command: Proxy, Source: ap("[2001:db8::1]:56324"), Destination: ap("[2001:db8:ffff::2]:8443")},
		},
		{
			name: "IPv4-mapped IPv6, unmapped",
			src:  ap("[::ffff:192.0.2.1]:1"), dst: ap("[::ffff:198.51.100.7]:2"),
			v1:    "PROXY TCP4 192.0.2.1 198.51.100.7 1 2\r\n",
			v2fam: famTCP4,
			want:  Header{Command: Proxy, Source: ap("192.0.2.1:1"), Destination: ap("198.51.100.7:2")},
		},
		{
			name: "mixed: IPv4 source, IPv6 destination",
			src:  ap("192.0.2.1:1000"), dst: ap("[2001:db8::2]:443"),
			v1:    "PROXY TCP6 ::ffff:192.0.2.1 2001:db8::2 1000 443\r\n",
			v2fam: famTCP6,
			want:  Header{Command: Proxy, Source: ap("192.0.2.1:1000"), Destination: ap("[2001:db8::2]:443")},
		},
		{
			name: "mixed: IPv6 source, mapped destination",
			src:  ap("[2001:db8::1]:1000"), dst: ap("[::ffff:198.51.100.7]:443"),
			v1:    "PROXY TCP6 2001:db8::1 ::ffff:198.51.100.7 1000 443\r\n",
			v2fam: famTCP6,
			want:  Header{Command: Proxy, Source: ap("[2001:db8::1]:1000"), Destination: ap("198.51.100.7:443")},
		},
		{
			name: "zone dropped",
			src:  ap("[fe80::1%eth0]:1000"), dst: ap("[fe80::2%eth0]:22"),
			v1:    "PROXY TCP6 fe80::1 fe80::2 1000 22\r\n",
			v2fam: famTCP6,
			want:  Header{Command: Proxy, Source: ap("[fe80::1]:1000"), Destination: ap("[fe80::2]:22")},
		},
		{
			name: "ports 0 and 65535",
			src:  ap("10.0.0.1:0"), dst: ap("10.0.0.2:65535"),
			v1:    "PROXY TCP4 10.0.0.1 10.0.0.2 0 65535\r\n",
			v2fam: famTCP4,
			want:  Header{Command: Proxy, Source: ap("10.0.0.1:0"), Destination: ap("10.0.0.2:65535")},
		},
		{
			name:  "unknown destination",
			src:   ap("192.0.2.1:1000"),
			v1:    "PROXY TCP4 192.0.2.1 0.0.0.0 1000 0\r\n",
			v2fam: famTCP4,
			want:  Header{Command: Proxy, Source: ap("192.0.2.1:1000"), Destination: ap("0.0.0.0:0")},
		},
		{
			name: "unknown source",
			dst:  ap("198.51.100.7:443"),
			v1:   "PROXY UNKNOWN\r\n", v2fam: famUnspec,
			want: Header{Command: Local},
		},
		{
			name: "nothing known",
			v1:   "PROXY UNKNOWN\r\n", v2fam: famUnspec,
			want: Header{Command: Local},
		},
	}
	for _, tt := range tests {
		for _, version := range []int{1, 2} {
			var w writeCounter
			if err := Write(&w, version, tt.src, tt.dst); err != nil {
				t.Errorf("%s: Write v%d: %v", tt.name, version, err)
				continue
			}
			if len(w.writes) != 1 {
				t.Errorf("%s: Write v%d made %d Write calls, want 1", tt.name, version, len(w.writes))
				continue
			}
			b := w.writes[0]
			switch version {
			case 1:
				if string(b) != tt.v1 {
					t.Errorf("%s: Write v1 = %q, want %q", tt.name, b, tt.v1)
				}
			case 2:
				wantCmd := byte(0x21)
				if tt.want.Command == Local {
					wantCmd = 0x20
				}
				if !bytes.HasPrefix(b, sigV2) || len(b) < 16 || b[12] != wantCmd || b[13] != tt.v2fam {
					t.Errorf("%s: Write v2 = % x, want ver_cmd %#x, fam %#02x", tt.name, b, wantCmd, tt.v2fam)
				}
			}
			payload := []byte("GET / HTTP/1.1\r\n\r\n")
			h, rest, err := readBytes(append(b, payload...))
			want := tt.want
			want.Version = version
			if err != nil || !equal(h, &want) || !bytes.Equal(rest, payload) {
				t.Errorf("%s: v%d: Read = %s, %v, rest %q; want %s, nil, %q", tt.name, version, describe(h), err, rest, describe(&want), payload)
			}
		}
	}
}

// Known bytes, checked field by field.

func TestReadV1Vectors(t *testing.T) {
	tests := []struct {
		in   string
		want Header
	}{
		{"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
			Header{Version: 1, Command: Proxy, Source: ap("192.168.0.1:56324"), Destination: ap("192.168.0.11:443")}},
		{"PROXY TCP6 2001:db8::1 2001:db8::11 56324 443\r\n",
			Header{Version: 1, Command: Proxy, Source: ap("[2001:db8::1]:56324"), Destination: ap("[2001:db8::11]:443")}},
		{"PROXY TCP6 ::ffff:192.168.0.1 2001:db8::11 56324 443\r\n",
			Header{Version: 1, Command: Proxy, Source: ap("192.168.0.1:56324"), Destination: ap("[2001:db8::11]:443")}},
		{"PROXY UNKNOWN\r\n", Header{Version: 1, Command: Local}},
		// The spec's worst case: 107 bytes, whatever follows UNKNOWN ignored.
		{"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n",
			Header{Version: 1, Command: Local}},
		{"PROXY UNKNOWN 1.2.3.4\r\n", Header{Version: 1, Command: Local}},
	}
	for _, tt := range tests {
		if strings.HasPrefix(tt.in, "PROXY UNKNOWN ffff") && len(tt.in) != maxV1Len {
			t.Fatalf("the worst case is %d bytes, want %d", len(tt.in), maxV1Len)
		}
		h, rest, err := readBytes([]byte(tt.in + "after"))
		if err != nil || !equal(h, &tt.want) || string(rest) != "after" {
			t.Errorf("Read(%q) = %s, %v, rest %q; want %s, nil, %q", tt.in, describe(h), err, rest, describe(&tt.want), "after")
		}
	}

	// Writing gives the spec's example back.
	h := Header{Version: 1, Command: Proxy, Source: ap("192.168.0.1:56324"), Destination: ap("192.168.0.11:443")}
	if b, err := h.Append(nil); err != nil || string(b) != "PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n" {
		t.Errorf("Append = %q, %v", b, err)
	}
}

// v2IPv4 is a version 2 header built by hand: PROXY, TCP over IPv4, from
// 192.168.0.1:56324 to 192.168.0.11:443, with two TLVs.
var v2IPv4 = []byte{
	0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a, // signature
	0x21,       // version 2, command PROXY
	0x11,       // AF_INET, STREAM
	0x00, 0x1f, // length: 12 + 5 + 14 = 31
	192, 168, 0, 1, // source address
	192, 168, 0, 11, // destination address
	0xdc, 0x04, // source port 56324
	0x01, 0xbb, // destination port 443
	0x01, 0x00, 0x02, 'h', '2', // TLV ALPN "h2"
	0x02, 0x00, 0x0b, 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', 'm', // TLV authority
}

// v2IPv6 is a version 2 header built by hand: PROXY, TCP over IPv6, from
// [2001:db8::1]:56324 to [2001:db8::11]:443, with a NOOP TLV and an empty one.
var v2IPv6 = []byte{
	0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a, // signature
	0x21,       // version 2, command PROXY
	0x21,       // AF_INET6, STREAM
	0x00, 0x2d, // length: 36 + 6 + 3 = 45
	0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, // source address
	0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, // destination address
	0xdc, 0x04, // source port 56324
	0x01, 0xbb, // destination port 443
	0x04, 0x00, 0x03, 0, 0, 0, // TLV NOOP, 3 bytes
	0xe0, 0x00, 0x00, // TLV 0xe0 (custom), empty
}

// v2Local is the health check header: LOCAL, AF_UNSPEC, no bytes after.
var v2Local = []byte{
	0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
	0x20, 0x00, 0x00, 0x00,
}

func TestReadV2Vectors(t *testing.T) {
	h, rest, err := readBytes(append(bytes.Clone(v2IPv4), "after"...))
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 2 || h.Command != Proxy {
		t.Errorf("IPv4: version %d, command %v; want 2, PROXY", h.Version, h.Command)
	}
	if h.Source != ap("192.168.0.1:56324") || h.Destination != ap("192.168.0.11:443") {
		t.Errorf("IPv4: addresses %v -> %v", h.Source, h.Destination)
	}
	if len(h.TLVs) != 2 ||
		h.TLVs[0].Type != TypeALPN || string(h.TLVs[0].Value) != "h2" ||
		h.TLVs[1].Type != TypeAuthority || string(h.TLVs[1].Value) != "example.com" {
		t.Errorf("IPv4: TLVs %s", describe(h))
	}
	if string(rest) != "after" {
		t.Errorf("IPv4: left %q, want %q", rest, "after")
	}
	if b, err := h.Append(nil); err != nil || !bytes.Equal(b, v2IPv4) {
		t.Errorf("IPv4: Append = % x, %v; want the same bytes", b, err)
	}

	h, rest, err = readBytes(append(bytes.Clone(v2IPv6), "after"...))
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 2 || h.Command != Proxy ||
		h.Source != ap("[2001:db8::1]:56324") || h.Destination != ap("[2001:db8::11]:443") {
		t.Errorf("IPv6: %s", describe(h))
	}
	if len(h.TLVs) != 2 ||
		h.TLVs[0].Type != TypeNoop || !bytes.Equal(h.TLVs[0].Value, []byte{0, 0, 0}) ||
		h.TLVs[1].Type != 0xe0 || len(h.TLVs[1].Value) != 0 {
		t.Errorf("IPv6: TLVs %s", describe(h))
	}
	if string(rest) != "after" {
		t.Errorf("IPv6: left %q, want %q", rest, "after")
	}
	if b, err := h.Append(nil); err != nil || !bytes.Equal(b, v2IPv6) {
		t.Errorf("IPv6: Append = % x, %v; want the same bytes", b, err)
	}

	h, rest, err = readBytes(append(bytes.Clone(v2Local), "after"...))
	if err != nil || !equal(h, &Header{Version: 2, Command: Local}) || string(rest) != "after" {
		t.Errorf("LOCAL: %s, %v, left %q", describe(h), err, rest)
	}
	if b, err := h.Append(nil); err != nil || !bytes.Equal(b, v2Local) {
		t.Errorf("LOCAL: Append = % x, %v; want the same bytes", b, err)
	}
}

// v2 builds a version 2 header from its ver_cmd and fam bytes and its body,
// with the length of the body.
func v2(verCmd, fam byte, body ...byte) []byte {
	b := append(bytes.Clone(sigV2), verCmd, fam, byte(len(body)>>8), byte(len(body)))
	return append(b, body...)
}

// Families that carry no IP addresses are read, as unknown addresses; LOCAL
// discards the addresses of any family.
func TestReadV2OtherFamilies(t *testing.T) {
	inet := []byte{192, 0, 2, 1, 192, 0, 2, 2, 0, 1, 0, 2}
	tests := []struct {
		name string
		in   []byte
		want Header
	}{
		{"PROXY AF_UNSPEC", v2(0x21, 0x00), Header{Version: 2, Command: Proxy}},
		{"PROXY AF_UNSPEC with a TLV", v2(0x21, 0x00, 0x05, 0x00, 0x01, 'x'),
			Header{Version: 2, Command: Proxy, TLVs: []TLV{{TypeUniqueID, []byte("x")}}}},
		{"PROXY AF_UNIX", v2(0x21, 0x31, make([]byte, 216)...), Header{Version: 2, Command: Proxy}},
		{"LOCAL AF_INET", v2(0x20, 0x11, inet...), Header{Version: 2, Command: Local}},
		{"LOCAL AF_INET UDP", v2(0x20, 0x12, inet...), Header{Version: 2, Command: Local}},
		{"LOCAL AF_UNIX DGRAM", v2(0x20, 0x32, make([]byte, 216)...), Header{Version: 2, Command: Local}},
		{"LOCAL AF_INET6 with a TLV", v2(0x20, 0x21, append(make([]byte, 36), 0x04, 0x00, 0x00)...),
			Header{Version: 2, Command: Local, TLVs: []TLV{{TypeNoop, nil}}}},
	}
	for _, tt := range tests {
		h, rest, err := readBytes(append(tt.in, "after"...))
		if err != nil || !equal(h, &tt.want) || string(rest) != "after" {
			t.Errorf("%s: Read = %s, %v, left %q; want %s", tt.name, describe(h), err, rest, describe(&tt.want))
		}
	}
}

func TestAppendErrors(t *testing.T) {
	src, dst := ap("192.0.2.1:1"), ap("192.0.2.2:2")
	big := make([]byte, 40000)
	tests := []struct {
		name string
		h    Header
	}{
		{"version 0", Header{Command: Proxy, Source: src, Destination: dst}},
		{"version 3", Header{Version: 3, Command: Proxy, Source: src, Destination: dst}},
		{"command 2", Header{Version: 2, Command: 2, Source: src, Destination: dst}},
		{"v1 with TLVs", Header{Version: 1, Command: Proxy, Source: src, Destination: dst, TLVs: []TLV{{TypeNoop, nil}}}},
		{"v2 TLV over 65535 bytes", Header{Version: 2, Command: Proxy, TLVs: []TLV{{TypeNoop, make([]byte, 65536)}}}},
		{"v2 over 65535 bytes", Header{Version: 2, Command: Proxy, TLVs: []TLV{{TypeNoop, big}, {TypeNoop, big}}}},
	}
	for _, tt := range tests {
		prefix := []byte("prefix")
		b, err := tt.h.Append(prefix)
		if !errors.Is(err, ErrInvalidHeader) || !bytes.Equal(b, prefix) {
			t.Errorf("%s: Append = %q, %v; want the prefix alone and ErrInvalidHeader", tt.name, b, err)
		}
		var w writeCounter
		if n, err := tt.h.WriteTo(&w); !errors.Is(err, ErrInvalidHeader) || n != 0 || len(w.writes) != 0 {
			t.Errorf("%s: WriteTo = %d, %v after %d writes; want 0, ErrInvalidHeader, none", tt.name, n, err, len(w.writes))
		}
	}
	if err := Write(io.Discard, 3, src, dst); !errors.Is(err, ErrInvalidHeader) {
		t.Errorf("Write version 3: %v, want ErrInvalidHeader", err)
	}

	// The largest version 2 header that fits.
	h := Header{Version: 2, Command: Proxy, TLVs: []TLV{{TypeNoop, make([]byte, 65535-3)}}}
	b, err := h.Append(nil)
	if err != nil || len(b) != 16+65535 {
		t.Fatalf("Append of a 65535-byte body: %d bytes, %v", len(b), err)
	}
	got, rest, err := readBytes(b)
	if err != nil || !equal(got, &h) || len(rest) != 0 {
		t.Errorf("reading the 65535-byte body: %v, left %d bytes", err, len(rest))
	}
}

// shortWriter accepts n bytes of each Write.
type shortWriter struct{ n int }

func (w shortWriter) Write(p []byte) (int, error) { return min(w.n, len(p)), nil }

type failWriter struct{}

var errWrite = errors.New("write failed")

func (failWriter) Write(p []byte) (int, error) { return 0, errWrite }

func TestWriteErrors(t *testing.T) {
	src, dst := ap("192.0.2.1:1"), ap("192.0.2.2:2")
	if err := Write(shortWriter{5}, 1, src, dst); !errors.Is(err, io.ErrShortWrite) || !strings.HasPrefix(err.Error(), "proxyproto: ") {
		t.Errorf("short write: %v, want a proxyproto: error wrapping io.ErrShortWrite", err)
	}
	if err := Write(failWriter{}, 2, src, dst); !errors.Is(err, errWrite) {
		t.Errorf("failed write: %v, want it wrapped", err)
	}
	h := Header{Version: 1, Command: Proxy, Source: src, Destination: dst}
	if n, err := h.WriteTo(shortWriter{5}); n != 5 || !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("WriteTo a short writer = %d, %v; want 5, io.ErrShortWrite", n, err)
	}
}

// A Local header is written without its addresses.
func TestWriteLocalDropsAddresses(t *testing.T) {
	for _, version := range []int{1, 2} {
		h := Header{Version: version, Command: Local, Source: ap("192.0.2.1:1"), Destination: ap("192.0.2.2:2")}
		b, err := h.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := readBytes(b)
		if err != nil || !equal(got, &Header{Version: version, Command: Local}) {
			t.Errorf("v%d: Local header with addresses read back as %s, %v", version, describe(got), err)
		}
	}
	// A Proxy header with no source: version 2 keeps the command.
	h := Header{Version: 2, Command: Proxy, TLVs: []TLV{{TypeAuthority, []byte("example.com")}}}
	b, _ := h.Append(nil)
	if got, _, err := readBytes(b); err != nil || !equal(got, &h) {
		t.Errorf("v2 PROXY AF_UNSPEC read back as %s, %v", describe(got), err)
	}
}

func TestCommandString(t *testing.T) {
	for c, want := range map[Command]string{Local: "LOCAL", Proxy: "PROXY", 7: "Command(7)"} {
		if got := c.String(); got != want {
			t.Errorf("Command(%d).String() = %q, want %q", uint8(c), got, want)
		}
	}
}
