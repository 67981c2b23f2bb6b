package proxyproto

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzRead checks that Read never panics, consumes exactly the header (or
// nothing, when there is none), and that a header it returns writes back in
// a canonical form that reads as the same header.
func FuzzRead(f *testing.F) {
	for _, s := range []string{
		"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nGET / HTTP/1.1\r\n",
		"PROXY TCP6 2001:db8::1 2001:db8::11 56324 443\r\n",
		"PROXY TCP6 ::ffff:192.168.0.1 2001:db8::11 1 2\r\n",
		"PROXY TCP6 ::ffff:192.168.0.1 ::ffff:192.168.0.2 1 2\r\n",
		"PROXY UNKNOWN\r\n",
		"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n",
		"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
		"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
		"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
		"PROXY TCP4 " + strings.Repeat("1", 120) + "\r\n",
		"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
		"GET / HTTP/1.1\r\n",
		"\x16\x03\x01\x00\x05",
		"SSH-2.0-OpenSSH\r\n",
		"",
		"PRO",
		string(v2IPv4) + "after",
		string(v2IPv6),
		string(v2Local),
		string(v2(0x21, 0x00)),
		string(v2(0x21, 0x31, make([]byte, 216)...)),
		string(v2(0x20, 0x12, make([]byte, 12)...)),
		string(v2(0x21, 0x21, append(make([]byte, 36), 0x05, 0x00, 0x01, 'x')...)),
		string(v2(0x21, 0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 192, 0, 2, 1,
			0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 1, 0, 2)),
		string(v2(0x21, 0x11, append(make([]byte, 12), 0x04, 0x00)...)),
		string(v2(0x31, 0x11, make([]byte, 12)...)),
		string(v2IPv4[:20]),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, rest, err := readBytes(data)
		consumed := len(data) - len(rest)
		if !bytes.Equal(rest, data[consumed:]) {
			t.Fatalf("the bytes left are not the end of the input")
		}
		if err != nil {
			if h != nil {
				t.Fatalf("Read returned a header with error %v", err)
			}
			if !strings.HasPrefix(err.Error(), "proxyproto: ") {
				t.Fatalf("error without the package prefix: %v", err)
			}
			switch {
			case errors.Is(err, ErrNoProxyHeader), errors.Is(err, io.EOF):
				if consumed != 0 {
					t.Fatalf("%v after consuming %d bytes", err, consumed)
				}
			case errors.Is(err, ErrMalformed), errors.Is(err, io.ErrUnexpectedEOF):
			default:
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if h.Version == 1 && consumed > maxV1Len {
			t.Fatalf("version 1 header of %d bytes", consumed)
		}
		b, err := h.Append(nil)
		if err != nil {
			t.Fatalf("Append(%s): %v", describe(h), err)
		}
		h2, rest2, err := readBytes(b)
		if err != nil || !equal(h, h2) || len(rest2) != 0 {
			t.Fatalf("read %s, wrote %q, read back %s, %v, %d bytes left", describe(h), b, describe(h2), err, len(rest2))
		}
		if b2, _ := h2.Append(nil); !bytes.Equal(b, b2) {
			t.Fatalf("writing is not canonical: %q, then %q", b, b2)
		}
	})
}

// FuzzReadSmallBuffer checks that Read gives the same result from the
// smallest bufio.Reader (16 bytes, less than most headers) as from the
// default one.
func FuzzReadSmallBuffer(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nrest"))
	f.Add(append(bytes.Clone(v2IPv6), "rest"...))
	f.Fuzz(func(t *testing.T, data []byte) {
		h1, rest1, err1 := readBytes(data)
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		h2, err2 := Read(br)
		rest2, _ := io.ReadAll(br)
		if (err1 == nil) != (err2 == nil) || err1 == nil && !equal(h1, h2) || !bytes.Equal(rest1, rest2) {
			t.Fatalf("buffer sizes disagree: %s, %v, %q; %s, %v, %q", describe(h1), err1, rest1, describe(h2), err2, rest2)
		}
	})
}
