package sni

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/cryptobyte"
)

// FuzzParse checks that Parse never panics, that what it accepts is sound
// (a valid, normalised name; a whole handshake message), and that Peek, fed
// the same bytes in reads of chunk bytes, agrees with it and replays every
// byte. The seed corpus runs in every go test.
func FuzzParse(f *testing.F) {
	for _, seed := range parseSeeds(f) {
		f.Add(seed, uint8(0))
		f.Add(seed, uint8(1))
		f.Add(seed, uint8(200))
	}

	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		h, err := Parse(data)
		checkResult(t, h, err)

		// Peek, reading chunk+1 bytes at a time (in at most 64 reads, to
		// keep execs fast: unit tests cover 1-byte reads of whole hellos),
		// then EOF.
		size := max(int(chunk)+1, len(data)/64)
		sc := newScript(t, io.EOF, chunked(data, size)...)
		ph, conn, perr := (&Peeker{Timeout: -1}).Peek(sc)
		checkResult(t, ph, perr)
		if got := readAll(t, conn); !bytes.Equal(got, data) {
			t.Fatalf("Peek's conn replays % x, want % x", got, data)
		}
		if errors.Is(perr, ErrTooLarge) {
			return // Peek has a cap, Parse none
		}
		switch {
		case err == nil:
			if perr != nil || ph.ServerName != h.ServerName || !slices.Equal(ph.ALPN, h.ALPN) || !bytes.Equal(ph.Raw, h.Raw) || ph.RecordVersion != h.RecordVersion {
				t.Fatalf("Parse: %q %q; Peek: %v, %v", h.ServerName, h.ALPN, ph, perr)
			}
		case errors.Is(err, ErrIncomplete):
			if !errors.Is(perr, io.EOF) && !errors.Is(perr, io.ErrUnexpectedEOF) {
				t.Fatalf("Parse: %v; Peek: %v, want an EOF", err, perr)
			}
		default:
			if sentinel(err) != sentinel(perr) {
				t.Fatalf("Parse: %v; Peek: %v", err, perr)
			}
		}
	})
}

// FuzzParseAgreesWithCryptoTLS checks that where Parse and crypto/tls's
// server both take a hello, they read the same server name and ALPN list:
// a router that decides by them (an edge takes a hello that offers its
// agent protocol for an agent's) must see what the TLS server that then
// completes the handshake sees.
func FuzzParseAgreesWithCryptoTLS(f *testing.F) {
	for _, seed := range parseSeeds(f) {
		f.Add(seed)
	}
	f.Add(record(buildHello(sniExt("app.example"), alpnExt("tunnelkit/1"), versionsExt(0x0304))))
	f.Add(record(buildHello(alpnExt("h2", "tunnelkit/1", "http/1.1"))))

	errStop := errors.New("stop")
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := Parse(data)
		if err != nil {
			return
		}
		var info *tls.ClientHelloInfo
		cfg := &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			info = chi
			return nil, errStop
		}}
		tls.Server(newScript(nil, io.EOF, data), cfg).Handshake()
		if info == nil {
			return // crypto/tls refused it
		}
		if !strings.EqualFold(info.ServerName, h.RawServerName) || !slices.Equal(info.SupportedProtos, h.ALPN) {
			t.Fatalf("crypto/tls read the name %q and ALPN %q; Parse %q and %q", info.ServerName, info.SupportedProtos, h.RawServerName, h.ALPN)
		}
	})
}

// parseSeeds are hellos, whole, split and broken, and other first bytes.
func parseSeeds(f *testing.F) [][]byte {
	rec := goHello(f)
	msg := handshakeMsg(f, rec)
	alpn := clientConfig(f, appName)
	alpn.NextProtos = []string{"h2", "http/1.1"}
	ech := clientConfig(f, appName)
	ech.EncryptedClientHelloConfigList = getPKI(f).echConfigList
	ccs := []byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x01}
	host := bytes.Index(msg, []byte(appName))

	return [][]byte{
		rec,
		append(bytes.Clone(rec), ccs...),
		captureHello(f, alpn),
		captureHello(f, ech),
		reframe(msg, 1),
		reframe(msg, 3),
		reframe(msg, 100),
		splitRecords(msg, 2),
		splitRecords(msg, host+4),
		rec[:len(rec)-1],
		record(buildHello()),
		record(buildHelloBody(func(*cryptobyte.Builder) {})),
		record(buildHello(sniExt("Example.COM."), alpnExt("h2", "http/1.1"), versionsExt(0x0a0a, 0x0304, 0x0303), echExt())),
		record(buildHello(sniExt("a.example", "b.example"))),
		record(buildHello(sniExt("a.example"), sniExt("b.example"))),
		record(buildHello(sniEntries(nameEntry{1, "x"}, nameEntry{0, "x.example"}))),
		record(buildHello(sniExt("192.0.2.1"))),
		record(buildHello(sniExt("exa mple.com"))),
		record(buildHello(sniExt(strings.Repeat("a", 64) + ".test"))),
		record(buildHello(sniExt(""))),
		[]byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"),
		[]byte("SSH-2.0-OpenSSH_9.6\r\n"),
		[]byte("PROXY TCP4 192.0.2.1 192.0.2.2 56324 443\r\n"),
		[]byte("G"),
		{0x80, 0x2e, 0x01, 0x03, 0x01},
		{0x16, 0x03, 0x01, 0xff, 0xff},
		{0x16, 0x03, 0x01, 0x05, 0xec},
		{0x15, 0x03, 0x01, 0x00, 0x02, 0x01, 0x00},
		{0x16, 0x03, 0x01, 0x00, 0x00},
		{0x16},
		{},
	}
}

var sentinels = []error{ErrNotTLS, ErrMalformed, ErrTooLarge, ErrInvalidName, ErrIncomplete}

func sentinel(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

// checkResult checks what Parse or Peek returned.
func checkResult(t *testing.T, h *ClientHello, err error) {
	t.Helper()
	if err != nil {
		if h != nil {
			t.Fatalf("a ClientHello with error %v", err)
		}
		if sentinel(err) == nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("error %v is none of the package's", err)
		}
		return
	}
	if h.RawServerName == "" && h.ServerName != "" {
		t.Fatalf("ServerName %q without RawServerName", h.ServerName)
	}
	if h.RawServerName != "" {
		if want := strings.ToLower(strings.TrimSuffix(h.RawServerName, ".")); h.ServerName != want {
			t.Fatalf("ServerName %q for raw %q, want %q", h.ServerName, h.RawServerName, want)
		}
		if n, upper, err := checkHostName([]byte(h.ServerName)); err != nil || upper || n != len(h.ServerName) {
			t.Fatalf("ServerName %q is not a normalised host name: %v", h.ServerName, err)
		}
		if strings.HasSuffix(h.ServerName, ".") || len(h.ServerName) > 253 {
			t.Fatalf("ServerName %q", h.ServerName)
		}
		for _, c := range []byte(h.ServerName) {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
				t.Fatalf("ServerName %q has byte %q", h.ServerName, c)
			}
		}
	}
	s := cryptobyte.String(h.Raw)
	var typ uint8
	var body cryptobyte.String
	if !s.ReadUint8(&typ) || typ != typeClientHello || !s.ReadUint24LengthPrefixed(&body) || !s.Empty() {
		t.Fatalf("Raw is not one ClientHello message: % x", h.Raw[:min(len(h.Raw), 16)])
	}
	for _, p := range h.ALPN {
		if p == "" {
			t.Fatal("empty ALPN protocol")
		}
	}
	for _, v := range h.SupportedVersions {
		if isGREASE(v) {
			t.Fatalf("GREASE version %#04x reported", v)
		}
	}
}
