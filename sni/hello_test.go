package sni

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"golang.org/x/crypto/cryptobyte"
)

func TestParseGoDefaultHello(t *testing.T) {
	rec := goHello(t)
	h, err := Parse(rec)
	if err != nil {
		t.Fatal(err)
	}
	if h.ServerName != appName || h.RawServerName != appName {
		t.Errorf("ServerName %q, RawServerName %q; want %q", h.ServerName, h.RawServerName, appName)
	}
	if h.ALPN != nil || h.ECH {
		t.Errorf("ALPN %q, ECH %v; want none", h.ALPN, h.ECH)
	}
	if h.Version != tls.VersionTLS12 {
		t.Errorf("Version %#04x, want %#04x", h.Version, tls.VersionTLS12)
	}
	if want := []uint16{tls.VersionTLS13, tls.VersionTLS12}; !slices.Equal(h.SupportedVersions, want) {
		t.Errorf("SupportedVersions %#04x, want %#04x", h.SupportedVersions, want)
	}
	if !bytes.Equal(h.Raw, handshakeMsg(t, rec)) {
		t.Error("Raw is not the handshake message")
	}
	t.Logf("Go %s default ClientHello: %d bytes", "1.26", len(rec))
}

func TestParseReframed(t *testing.T) {
	msg := handshakeMsg(t, goHello(t))
	host := bytes.Index(msg, []byte(appName))
	if host < 0 {
		t.Fatal("host name not found in the hello")
	}
	cases := map[string][]byte{
		"1-byte records":             reframe(msg, 1),
		"2-byte records":             reframe(msg, 2),
		"3-byte records":             reframe(msg, 3),
		"4-byte records":             reframe(msg, 4),
		"5-byte records":             reframe(msg, 5),
		"100-byte records":           reframe(msg, 100),
		"1000-byte records":          reframe(msg, 1000),
		"split in handshake header":  splitRecords(msg, 1, 3),
		"split after header":         splitRecords(msg, 4),
		"split inside the host name": splitRecords(msg, host+3, host+9),
		"split before the last byte": splitRecords(msg, len(msg)-1),
	}
	for name, stream := range cases {
		t.Run(name, func(t *testing.T) {
			h, err := Parse(stream)
			if err != nil {
				t.Fatal(err)
			}
			if h.ServerName != appName {
				t.Errorf("ServerName %q, want %q", h.ServerName, appName)
			}
			if !bytes.Equal(h.Raw, msg) {
				t.Error("Raw is not the reassembled handshake message")
			}
		})
	}
}

// Every proper prefix of a valid stream is incomplete, never malformed and
// never a success with an empty name.
func TestParseIncomplete(t *testing.T) {
	msg := handshakeMsg(t, goHello(t))
	for _, stream := range [][]byte{record(msg), reframe(msg, 7)} {
		for i := range len(stream) {
			if h, err := Parse(stream[:i]); !errors.Is(err, ErrIncomplete) {
				t.Fatalf("Parse of %d of %d bytes: %v, %v; want ErrIncomplete", i, len(stream), h, err)
			}
		}
	}
}

func TestParseNormalisesName(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"Example.COM.", "example.com"},
		{"example.com.", "example.com"},
		{"EXAMPLE.com", "example.com"},
		{"example.com", "example.com"},
		{"localhost", "localhost"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"_acme.Example-1.test", "_acme.example-1.test"},
		{"a.b.c.d.e", "a.b.c.d.e"},
		{"1.2.3.example", "1.2.3.example"},
		{strings.Repeat("a", 63) + ".test", strings.Repeat("a", 63) + ".test"},
		{longName(253), longName(253)},
		{longName(253) + ".", longName(253)},
	} {
		h, err := Parse(record(buildHello(sniExt(tc.raw))))
		if err != nil {
			t.Errorf("%q: %v", tc.raw, err)
			continue
		}
		if h.ServerName != tc.want || h.RawServerName != tc.raw {
			t.Errorf("%q: ServerName %q RawServerName %q; want %q and %q", tc.raw, h.ServerName, h.RawServerName, tc.want, tc.raw)
		}
	}
}

// longName returns a valid host name of n bytes.
func longName(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strings.Repeat("x", min(63, n-b.Len())))
	}
	s := b.String()
	if strings.HasSuffix(s, ".") { // cannot happen for the sizes used
		panic(s)
	}
	return s
}

func TestParseInvalidNames(t *testing.T) {
	for _, raw := range []string{
		".",
		"..",
		"example..com",
		".example.com",
		"example.com..",
		"exa mple.com",
		"example.com ",
		"exa\x00mple.com",
		"example.com\n",
		"exa\tmple.com",
		"bücher.example",
		"example.com/path",
		"user@example.com",
		"example.com:443",
		"*.example.com",
		strings.Repeat("a", 64) + ".test",
		longName(254),
		"192.0.2.1",
		"192.0.2.1.",
		"127.1",
		"2130706433",
		"::1",
		"[::1]",
		"2001:db8::1",
		"host.123",
	} {
		_, err := Parse(record(buildHello(sniExt(raw))))
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("%q: %v, want ErrInvalidName", raw, err)
		}
	}
}

func TestParseNoServerName(t *testing.T) {
	for name, msg := range map[string][]byte{
		"no server_name extension": buildHello(alpnExt("h2")),
		"no extensions at all":     buildHello(),
		"no extensions block":      buildHelloBody(func(*cryptobyte.Builder) {}),
		"only other name types":    buildHello(sniEntries(nameEntry{1, "not a host name"})),
	} {
		h, err := Parse(record(msg))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if h.ServerName != "" || h.RawServerName != "" {
			t.Errorf("%s: ServerName %q", name, h.ServerName)
		}
	}
}

func TestParseNameTypes(t *testing.T) {
	// An entry of another type is skipped, before or after the host name.
	for _, e := range [][]nameEntry{
		{{7, "x"}, {nameTypeHostName, appName}},
		{{nameTypeHostName, appName}, {7, "x"}},
	} {
		h, err := Parse(record(buildHello(sniEntries(e...))))
		if err != nil || h.ServerName != appName {
			t.Errorf("%v: %v, %v", e, h, err)
		}
	}
}

// Two host_name entries are malformed: RFC 6066 allows one, crypto/tls
// rejects two, and picking one could route to a backend whose TLS server
// disagrees.
func TestParseTwoHostNames(t *testing.T) {
	for _, names := range [][]string{
		{"a.example", "b.example"},
		{appName, appName},
	} {
		_, err := Parse(record(buildHello(sniExt(names...))))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", names, err)
		}
	}
	// So is a second server_name extension.
	_, err := Parse(record(buildHello(sniExt("a.example"), sniExt("b.example"))))
	if !errors.Is(err, ErrMalformed) {
		t.Errorf("two server_name extensions: %v, want ErrMalformed", err)
	}
}

func TestParseALPN(t *testing.T) {
	for _, protos := range [][]string{
		{"h2"},
		{"h2", "http/1.1"},
		{"h3", "h2", "http/1.1", "acme-tls/1", "x"},
	} {
		h, err := Parse(record(buildHello(sniExt(appName), alpnExt(protos...))))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(h.ALPN, protos) {
			t.Errorf("ALPN %q, want %q", h.ALPN, protos)
		}
		if h.ServerName != appName {
			t.Errorf("ServerName %q", h.ServerName)
		}
	}
	// And from a real client.
	cfg := clientConfig(t, appName)
	cfg.NextProtos = []string{"h2", "http/1.1"}
	h, err := Parse(captureHello(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.ALPN, cfg.NextProtos) {
		t.Errorf("Go client: ALPN %q, want %q", h.ALPN, cfg.NextProtos)
	}
}

func TestParseSupportedVersions(t *testing.T) {
	h, err := Parse(record(buildHello(versionsExt(0x7a7a, tls.VersionTLS13, 0xfafa, tls.VersionTLS12))))
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint16{tls.VersionTLS13, tls.VersionTLS12}; !slices.Equal(h.SupportedVersions, want) {
		t.Errorf("SupportedVersions %#04x, want %#04x (GREASE removed)", h.SupportedVersions, want)
	}
	many := []uint16{0x0304, 0x0303, 0x0302, 0x0301, 0x0300, 0x7f1c}
	if h, err = Parse(record(buildHello(versionsExt(many...)))); err != nil || !slices.Equal(h.SupportedVersions, many) {
		t.Errorf("six versions: %v, %v", h, err)
	}
	h, err = Parse(record(buildHello()))
	if err != nil || h.SupportedVersions != nil {
		t.Errorf("no extension: SupportedVersions %v, %v; want nil", h.SupportedVersions, err)
	}
}

func TestParseECH(t *testing.T) {
	h, err := Parse(record(buildHello(sniExt(publicName), echExt())))
	if err != nil || !h.ECH {
		t.Fatalf("crafted: %v, %v; want ECH", h, err)
	}
	if h, err = Parse(record(buildHello(sniExt(publicName)))); err != nil || h.ECH {
		t.Fatalf("no extension: %v, %v; want no ECH", h, err)
	}

	// A real ECH hello: the visible name is the public name.
	cfg := clientConfig(t, appName)
	cfg.EncryptedClientHelloConfigList = getPKI(t).echConfigList
	h, err = Parse(captureHello(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if !h.ECH || h.ServerName != publicName {
		t.Errorf("Go ECH client: ECH %v, ServerName %q; want true, %q", h.ECH, h.ServerName, publicName)
	}
}

func TestParseGREASEExtensions(t *testing.T) {
	h, err := Parse(record(buildHello(
		ext{0x0a0a, nil}, sniExt(appName), ext{0x1a1a, []byte{0}}, alpnExt("h2"), ext{0xfafa, nil})))
	if err != nil || h.ServerName != appName || !slices.Equal(h.ALPN, []string{"h2"}) {
		t.Errorf("%+v, %v", h, err)
	}
}

func TestParseNotTLS(t *testing.T) {
	for _, b := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n"),
		[]byte("G"),
		[]byte("SSH-2.0-OpenSSH_9.6\r\n"),
		[]byte("PROXY TCP4 192.0.2.1 192.0.2.2 56324 443\r\n"),
		{0x80, 0x2e, 0x01, 0x03, 0x01},             // SSLv2-style hello
		{0x15, 0x03, 0x01, 0x00, 0x02, 0x01, 0x00}, // alert record
		{0x17, 0x03, 0x03, 0x00, 0x01, 0x00},       // application data
		{0x00},
	} {
		if _, err := Parse(b); !errors.Is(err, ErrNotTLS) {
			t.Errorf("% x: %v, want ErrNotTLS", b, err)
		}
	}
}

func TestParseTooLarge(t *testing.T) {
	for _, b := range [][]byte{
		{0x16, 0x03, 0x01, 0xff, 0xff},
		{0x16, 0x03, 0x01, 0x40, 0x01}, // 2^14 + 1
	} {
		if _, err := Parse(b); !errors.Is(err, ErrTooLarge) {
			t.Errorf("% x: %v, want ErrTooLarge", b, err)
		}
	}
	// A record of exactly 2^14 bytes is fine.
	const padding = 21 // the padding extension, RFC 7685
	pad := maxRecordLen - len(buildHello(sniExt(appName), ext{padding, nil}))
	msg := buildHello(sniExt(appName), ext{padding, make([]byte, pad)})
	if len(msg) != maxRecordLen {
		t.Fatalf("built a %d-byte hello, want %d", len(msg), maxRecordLen)
	}
	if h, err := Parse(record(msg)); err != nil || h.ServerName != appName {
		t.Errorf("a 2^14-byte record: %v, %v", h, err)
	}
}

func TestParseMalformed(t *testing.T) {
	good := buildHello(sniExt(appName))
	withType := func(typ uint8) []byte {
		m := bytes.Clone(good)
		m[0] = typ
		return m
	}
	cases := map[string][]byte{
		"ServerHello":                      record(withType(2)),
		"handshake type 0":                 record(withType(0)),
		"record version 2.0":               {0x16, 0x02, 0x00, 0x00, 0x01, 0x01},
		"record version 4.0":               {0x16, 0x04, 0x00},
		"empty record":                     {0x16, 0x03, 0x01, 0x00, 0x00},
		"alert record after the first":     append(record(good[:10]), 0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28),
		"application data after the first": append(record(good[:10]), 0x17, 0x03, 0x03, 0x00, 0x01, 0x00),
		"empty hello body":                 record([]byte{1, 0, 0, 0}),
		"body shorter than the random":     record(buildHelloRaw([]byte{3, 3, 1, 2, 3})),
		"odd cipher suites length":         record(buildHelloRaw(fixedFields(3, nil))),
		"extensions block too short":       record(buildHelloRaw(append(fixedFields(2, nil), 0x00, 0x05, 0x00))),
		"bytes after extensions":           record(buildHelloRaw(append(fixedFields(2, nil), 0x00, 0x00, 0xff))),
		"lone byte for extensions":         record(buildHelloRaw(append(fixedFields(2, nil), 0x00))),
		"truncated extension header":       record(buildHelloRaw(append(fixedFields(2, nil), 0x00, 0x02, 0x00, 0x00))),
		"empty server_name extension":      record(buildHello(ext{extServerName, nil})),
		"empty server_name list":           record(buildHello(ext{extServerName, []byte{0, 0}})),
		"server_name list too long":        record(buildHello(ext{extServerName, []byte{0, 9, 0, 0, 1, 'a'}})),
		"bytes after server_name list":     record(buildHello(ext{extServerName, append(sniExt("a.test").data, 0)})),
		"empty host_name":                  record(buildHello(sniExt(""))),
		"empty ALPN list":                  record(buildHello(ext{extALPN, []byte{0, 0}})),
		"empty ALPN protocol":              record(buildHello(ext{extALPN, []byte{0, 1, 0}})),
		"ALPN protocol too long":           record(buildHello(ext{extALPN, []byte{0, 2, 5, 'h'}})),
		"two ALPN extensions":              record(buildHello(alpnExt("h2"), alpnExt("h2"))),
		"empty supported_versions":         record(buildHello(ext{extSupportedVersions, []byte{0}})),
		"odd supported_versions":           record(buildHello(ext{extSupportedVersions, []byte{3, 3, 4, 3}})),
		"two supported_versions":           record(buildHello(versionsExt(0x0304), versionsExt(0x0304))),
		"two ECH extensions":               record(buildHello(echExt(), echExt())),
	}
	for name, b := range cases {
		if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

// fixedFields returns the fixed fields of a ClientHello body with a cipher
// suites vector of n bytes, then extra.
func fixedFields(n int, extra []byte) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint16(0x0303)
	b.AddBytes(make([]byte, 32))
	b.AddUint8(0)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(make([]byte, n)) })
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint8(0) })
	b.AddBytes(extra)
	return b.BytesOrPanic()
}

// buildHelloRaw wraps a body in a ClientHello handshake header.
func buildHelloRaw(body []byte) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8(typeClientHello)
	b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(body) })
	return b.BytesOrPanic()
}

// Bytes after the hello, in its record or in later records, are not looked
// at: they are the TLS server's business.
func TestParseIgnoresTrailingBytes(t *testing.T) {
	rec := goHello(t)
	ccs := []byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x01}
	for name, b := range map[string][]byte{
		"ChangeCipherSpec after": append(bytes.Clone(rec), ccs...),
		"garbage after":          append(bytes.Clone(rec), "garbage"...),
		"in the same record":     record(append(handshakeMsg(t, rec), 0x01, 0x00)),
	} {
		h, err := Parse(b)
		if err != nil || h.ServerName != appName {
			t.Errorf("%s: %v, %v", name, h, err)
			continue
		}
		if !bytes.Equal(h.Raw, handshakeMsg(t, rec)) {
			t.Errorf("%s: Raw includes the trailing bytes", name)
		}
	}
}

// Errors carry the package prefix and, where they quote the peer, quote it
// safely.
func TestErrorMessages(t *testing.T) {
	_, err := Parse(record(buildHello(sniExt("evil\n.example"))))
	if msg := fmt.Sprint(err); !strings.HasPrefix(msg, "sni: ") || strings.Contains(msg, "\n") {
		t.Errorf("error %q: want the sni: prefix and no raw newline", msg)
	}
	for _, err := range []error{ErrNotTLS, ErrMalformed, ErrTooLarge, ErrInvalidName, ErrIncomplete, ErrTimeout} {
		if !strings.HasPrefix(err.Error(), "sni: ") {
			t.Errorf("%q lacks the sni: prefix", err)
		}
	}
}

func TestParseAllocs(t *testing.T) {
	if testing.Short() || testtools.RaceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	for name, rec := range map[string][]byte{
		"Go default": goHello(t),
		"ALPN and upper case": record(buildHello(sniExt("App.Example.Test."), alpnExt("h2", "http/1.1"),
			versionsExt(0x0304, 0x0303))),
	} {
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := Parse(rec); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 2 {
			t.Errorf("%s: %v allocations per Parse, want at most 2", name, allocs)
		}
	}
}

// RecordVersion is the version of the first record, however the hello is
// framed.
func TestRecordVersion(t *testing.T) {
	h, err := Parse(goHello(t))
	if err != nil {
		t.Fatal(err)
	}
	if h.RecordVersion != tls.VersionTLS10 {
		t.Errorf("Go's hello: record version %#04x, want 0x0301", h.RecordVersion)
	}
	msg := handshakeMsg(t, goHello(t))
	stream := append(recordOf(recordTypeHandshake, msg[:10]), reframe(msg[10:], 100)...)
	stream[2] = 3 // the first record's version: 0x0303
	h, _, err = (&Peeker{Timeout: -1}).Peek(newScript(t, io.EOF, stream))
	if err != nil {
		t.Fatal(err)
	}
	if h.RecordVersion != tls.VersionTLS12 {
		t.Errorf("Peek: record version %#04x, want 0x0303", h.RecordVersion)
	}
}
