package sni

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// Names used throughout the tests.
const (
	appName    = "app.example.test"
	publicName = "public.example.test" // the ECH public name
)

// ---- Real hellos, captured from crypto/tls clients ----

// errCaptured stops a client handshake once its first flight is captured.
var errCaptured = errors.New("first flight captured")

// captureConn records the first Write of a TLS client, its ClientHello, and
// fails it, so the handshake stops there.
type captureConn struct {
	net.Conn // nil: only Write and the deadline setters are called
	first    []byte
}

func (c *captureConn) Write(p []byte) (int, error) {
	if c.first == nil {
		c.first = bytes.Clone(p)
	}
	return 0, errCaptured
}
func (c *captureConn) Read([]byte) (int, error)         { return 0, errCaptured }
func (c *captureConn) Close() error                     { return nil }
func (c *captureConn) SetDeadline(time.Time) error      { return nil }
func (c *captureConn) SetWriteDeadline(time.Time) error { return nil }
func (c *captureConn) SetReadDeadline(time.Time) error  { return nil }

// captureHello returns the bytes a crypto/tls client with cfg sends first:
// its ClientHello, in one record.
func captureHello(tb testing.TB, cfg *tls.Config) []byte {
	tb.Helper()
	c := &captureConn{}
	if err := tls.Client(c, cfg).Handshake(); !errors.Is(err, errCaptured) {
		tb.Fatalf("capturing a ClientHello: handshake error %v", err)
	}
	if len(c.first) == 0 {
		tb.Fatal("capturing a ClientHello: nothing written")
	}
	return c.first
}

var (
	goHelloOnce sync.Once
	goHelloRec  []byte
)

// goHello returns the ClientHello of a crypto/tls client with the default
// config and ServerName app.example.test: Go 1.26 offers X25519MLKEM768, so
// it is about 1.5 KB, more than a 1460-byte TCP segment. Callers must not
// modify it.
func goHello(tb testing.TB) []byte {
	goHelloOnce.Do(func() {
		goHelloRec = captureHello(tb, &tls.Config{ServerName: appName})
	})
	if len(goHelloRec) <= 1460 {
		tb.Fatalf("Go's default ClientHello is %d bytes, want more than one 1460-byte segment", len(goHelloRec))
	}
	return goHelloRec
}

// handshakeMsg returns the handshake message inside a single-record hello.
func handshakeMsg(tb testing.TB, rec []byte) []byte {
	tb.Helper()
	s := cryptobyte.String(rec)
	var typ uint8
	var version uint16
	var body cryptobyte.String
	if !s.ReadUint8(&typ) || !s.ReadUint16(&version) || !s.ReadUint16LengthPrefixed(&body) || !s.Empty() {
		tb.Fatalf("not a single TLS record: % x", rec[:min(len(rec), 16)])
	}
	return body
}

// reframe splits a handshake message into handshake records of at most size
// bytes each.
func reframe(msg []byte, size int) []byte {
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, record(msg[:n])...)
		msg = msg[n:]
	}
	return out
}

// splitRecords puts a handshake message into records that end at the given
// offsets of the message (and at its end).
func splitRecords(msg []byte, cuts ...int) []byte {
	var out []byte
	prev := 0
	for _, c := range append(cuts, len(msg)) {
		out = append(out, record(msg[prev:c])...)
		prev = c
	}
	return out
}

// record wraps data in one TLS handshake record.
func record(data []byte) []byte {
	return recordOf(recordTypeHandshake, data)
}

func recordOf(typ uint8, data []byte) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8(typ)
	b.AddUint16(0x0301)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(data) })
	return b.BytesOrPanic()
}

// ---- Crafted hellos ----

// ext is one raw extension.
type ext struct {
	typ  uint16
	data []byte
}

// nameEntry is one entry of a server_name list.
type nameEntry struct {
	typ  uint8
	name string
}

// sniExt builds a server_name extension with the given host_name entries.
func sniExt(names ...string) ext {
	entries := make([]nameEntry, len(names))
	for i, n := range names {
		entries[i] = nameEntry{nameTypeHostName, n}
	}
	return sniEntries(entries...)
}

func sniEntries(entries ...nameEntry) ext {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		for _, e := range entries {
			b.AddUint8(e.typ)
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(e.name)) })
		}
	})
	return ext{extServerName, b.BytesOrPanic()}
}

func alpnExt(protos ...string) ext {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		for _, p := range protos {
			b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(p)) })
		}
	})
	return ext{extALPN, b.BytesOrPanic()}
}

func versionsExt(versions ...uint16) ext {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) {
		for _, v := range versions {
			b.AddUint16(v)
		}
	})
	return ext{extSupportedVersions, b.BytesOrPanic()}
}

// echExt is an encrypted_client_hello extension; its content does not
// matter to this package.
func echExt() ext { return ext{extECH, []byte{0, 0, 1, 0, 1, 7, 0, 0, 0, 0}} }

// buildHello builds a ClientHello handshake message with the extensions
// given, in order.
func buildHello(exts ...ext) []byte {
	return buildHelloBody(func(b *cryptobyte.Builder) {
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			for _, e := range exts {
				b.AddUint16(e.typ)
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(e.data) })
			}
		})
	})
}

// buildHelloBody builds a ClientHello handshake message whose body is the
// fixed fields then what tail adds (the extensions block, or nothing).
func buildHelloBody(tail func(*cryptobyte.Builder)) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8(typeClientHello)
	b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint16(0x0303)
		b.AddBytes(make([]byte, 32)) // random
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) {})
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint16(0x1301) })
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint8(0) })
		tail(b)
	})
	return b.BytesOrPanic()
}

// ---- Conns ----

// errSilence is what a scriptConn returns when read past its script with
// silent set: Peek read when it had to decide.
var errSilence = errors.New("script: read past the end of the script")

// scriptConn is a net.Conn that returns its chunks, one per Read (or less if
// the buffer is short), then end. If end is nil, a read past the chunks
// fails the test: the client is silent, and a Peek that reads again would
// have waited.
type scriptConn struct {
	tb        testing.TB
	chunks    [][]byte
	end       error
	reads     int
	deadlines []time.Time
}

func newScript(tb testing.TB, end error, chunks ...[]byte) *scriptConn {
	var cs [][]byte
	for _, c := range chunks {
		if len(c) > 0 {
			cs = append(cs, bytes.Clone(c))
		}
	}
	return &scriptConn{tb: tb, chunks: cs, end: end}
}

// chunked cuts b into chunks of size bytes.
func chunked(b []byte, size int) [][]byte {
	var cs [][]byte
	for len(b) > 0 {
		n := min(size, len(b))
		cs = append(cs, b[:n])
		b = b[n:]
	}
	return cs
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.reads++
	if len(c.chunks) == 0 {
		if c.end == nil {
			if c.tb != nil {
				c.tb.Errorf("read %d: read past the last byte the client sent, so Peek would have waited", c.reads)
			}
			return 0, errSilence
		}
		return 0, c.end
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *scriptConn) Close() error                { return nil }
func (c *scriptConn) LocalAddr() net.Addr         { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }
func (c *scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50000}
}
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }
func (c *scriptConn) SetReadDeadline(t time.Time) error {
	c.deadlines = append(c.deadlines, t)
	return nil
}

// hookConn reports, on reads, each time a Read begins.
type hookConn struct {
	net.Conn
	reads chan int // buffered; a full channel drops reports
	n     int
}

func newHookConn(c net.Conn) *hookConn { return &hookConn{Conn: c, reads: make(chan int, 1<<14)} }

func (c *hookConn) Read(p []byte) (int, error) {
	c.n++
	select {
	case c.reads <- c.n:
	default:
	}
	return c.Conn.Read(p)
}

// tcpPair returns the two ends of a loopback TCP connection; both are closed
// when the test ends.
func tcpPair(tb testing.TB) (client, server *net.TCPConn) {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   *net.TCPConn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.AcceptTCP()
		accepted <- result{c, err}
	}()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	r := <-accepted
	if err != nil || r.err != nil {
		tb.Fatalf("loopback pair: dial %v, accept %v", err, r.err)
	}
	tb.Cleanup(func() { client.Close(); r.c.Close() })
	return client, r.c
}

// readAll reads conn to EOF.
func readAll(tb testing.TB, r io.Reader) []byte {
	tb.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		tb.Fatalf("reading the replay: %v", err)
	}
	return b
}

// ---- Leaks ----

// ---- Certificates and ECH ----

type testPKI struct {
	cert    tls.Certificate
	pool    *x509.CertPool
	certPEM []byte

	echKey        *ecdh.PrivateKey
	echConfig     []byte // one ECHConfig, for the server
	echConfigList []byte // for the client
}

var pki = sync.OnceValues(func() (*testPKI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: appName},
		DNSNames:              []string{appName, publicName},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &testPKI{
		cert:    tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		pool:    x509.NewCertPool(),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}
	p.pool.AddCert(leaf)

	if p.echKey, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	b := cryptobyte.NewBuilder(nil)
	b.AddUint16(extECH) // ECHConfig version
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint8(7)       // config_id
		b.AddUint16(0x0020) // DHKEM(X25519, HKDF-SHA256)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(p.echKey.PublicKey().Bytes()) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint16(0x0001) // HKDF-SHA256
			b.AddUint16(0x0001) // AES-128-GCM
		})
		b.AddUint8(32) // maximum_name_length
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(publicName)) })
		b.AddUint16(0) // no extensions
	})
	p.echConfig = b.BytesOrPanic()
	l := cryptobyte.NewBuilder(nil)
	l.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(p.echConfig) })
	p.echConfigList = l.BytesOrPanic()
	return p, nil
})

func getPKI(tb testing.TB) *testPKI {
	tb.Helper()
	p, err := pki()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// serverConfig is a TLS server config for the test names, with ECH keys.
func serverConfig(tb testing.TB) *tls.Config {
	p := getPKI(tb)
	return &tls.Config{
		Certificates: []tls.Certificate{p.cert},
		NextProtos:   []string{"http/1.1"},
		EncryptedClientHelloKeys: []tls.EncryptedClientHelloKey{
			{Config: p.echConfig, PrivateKey: p.echKey.Bytes()},
		},
	}
}

// clientConfig is a default TLS client config for name that trusts the test
// certificate.
func clientConfig(tb testing.TB, name string) *tls.Config {
	return &tls.Config{ServerName: name, RootCAs: getPKI(tb).pool}
}
