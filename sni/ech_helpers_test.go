package sni

import (
	"bufio"
	"crypto"
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
)

// secretName is the inner name of the ECH tests: the name a client wants,
// which only the holder of the ECH key learns. The backend's certificate
// is for it alone.
const secretName = "secret.example.test"

// ---- Keys ----

// suite is an HPKE cipher suite of an ECHConfig: KDF, AEAD.
type suite struct{ kdf, aead uint16 }

// testECHKey makes an X25519 ECH key with the config_id and cipher suites
// given, as NewECHKey does with its own, and its ECHConfigList.
func testECHKey(tb testing.TB, id uint8, name string, suites ...suite) (tls.EncryptedClientHelloKey, []byte) {
	tb.Helper()
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return echKeyOf(priv, id, name, suites...)
}

// echKeyOf makes the ECH key of priv with the config_id and cipher suites
// given, and its ECHConfigList.
func echKeyOf(priv *ecdh.PrivateKey, id uint8, name string, suites ...suite) (tls.EncryptedClientHelloKey, []byte) {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint16(echConfigVersion)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint8(id)
		b.AddUint16(kemX25519)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(priv.PublicKey().Bytes()) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			for _, s := range suites {
				b.AddUint16(s.kdf)
				b.AddUint16(s.aead)
			}
		})
		b.AddUint8(0)
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(name)) })
		b.AddUint16(0)
	})
	config := b.BytesOrPanic()
	return tls.EncryptedClientHelloKey{Config: config, PrivateKey: priv.Bytes(), SendAsRetry: true}, configList(config)
}

// configList makes an ECHConfigList of configs.
func configList(configs ...[]byte) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		for _, c := range configs {
			b.AddBytes(c)
		}
	})
	return b.BytesOrPanic()
}

type heldKey struct {
	key  tls.EncryptedClientHelloKey
	list []byte
	keys *ECHKeys
}

var (
	heldOnce sync.Once
	held     heldKey
)

// getHeldKey returns the key the client-facing server holds in the tests,
// made by NewECHKey for publicName, and the ECHKeys holding it alone.
func getHeldKey(tb testing.TB) heldKey {
	heldOnce.Do(func() {
		key, list, err := NewECHKey(publicName)
		if err != nil {
			tb.Fatal(err)
		}
		keys, err := NewECHKeys([]tls.EncryptedClientHelloKey{key})
		if err != nil {
			tb.Fatal(err)
		}
		held = heldKey{key, list, keys}
	})
	if held.keys == nil {
		tb.Fatal("no held key")
	}
	return held
}

// configID returns the config_id of a serialized ECHConfig.
func configID(tb testing.TB, config []byte) uint8 {
	c, err := parseECHConfig(config)
	if err != nil {
		tb.Fatal(err)
	}
	return c.id
}

// ---- TLS configs ----

var secretCert = sync.OnceValues(func() (tls.Certificate, error) {
	p, err := pki()
	if err != nil {
		return tls.Certificate{}, err
	}
	key := p.cert.PrivateKey.(crypto.Signer)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		DNSNames:     []string{secretName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert.Leaf, key.Public(), p.cert.PrivateKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: p.cert.PrivateKey}, nil
})

// backendConfig is the config of the split-mode backend: a plain TLS
// server for secretName, with no ECH key.
func backendConfig(tb testing.TB) *tls.Config {
	cert, err := secretCert()
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// echClient is the config of a client that wants secretName and has the
// ECHConfigList list.
func echClient(tb testing.TB, list []byte) *tls.Config {
	return &tls.Config{
		ServerName:                     secretName,
		RootCAs:                        getPKI(tb).pool,
		EncryptedClientHelloConfigList: list,
	}
}

// ---- Split mode, end to end ----

// connPair returns the two ends of a connection over transport, "pipe"
// (net.Pipe) or "tcp" (loopback), closed when the test ends.
func connPair(tb testing.TB, transport string) (net.Conn, net.Conn) {
	tb.Helper()
	switch transport {
	case "pipe":
		a, b := net.Pipe()
		tb.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	case "tcp":
		return tcpPair(tb)
	}
	tb.Fatalf("unknown transport %q", transport)
	return nil, nil
}

var transports = []string{"pipe", "tcp"}

// splitRun is what runSplit saw.
type splitRun struct {
	outer   *ClientHello
	res     *ECHResult
	hrr     bool // the backend sent a HelloRetryRequest
	client  tls.ConnectionState
	backend tls.ConnectionState
	reply   string // what the client read after writing "ping"
	// backendECH reports whether the hello the backend got carried an
	// encrypted_client_hello extension (the inner one).
	backendECH bool

	clientErr, backendErr, edgeErr error
}

// runSplit connects a crypto/tls client with clientCfg, through an edge
// that peeks its hello and decrypts it with keys, to a crypto/tls server
// with backendCfg, in split mode: the edge relays with Wrap and
// internal/pipe.JoinStreams, as the tunnel's edge does. The client writes
// "ping" and reads the answer, which the backend's pingPong writes.
func runSplit(t *testing.T, transport string, clientCfg, backendCfg *tls.Config, keys *ECHKeys) *splitRun {
	t.Helper()
	clientSide, edgeSide := connPair(t, transport)
	edgeUp, backendSide := connPair(t, transport)
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range []net.Conn{clientSide, edgeUp, backendSide} {
		c.SetDeadline(deadline)
	}
	r := &splitRun{}
	backendCfg = backendCfg.Clone()
	backendCfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		r.backendECH = slices.Contains(h.Extensions, extECH)
		return nil, nil
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		ts := tls.Server(backendSide, backendCfg)
		defer ts.Close()
		if r.backendErr = ts.Handshake(); r.backendErr != nil {
			return
		}
		r.backend = ts.ConnectionState()
		r.backendErr = pingPong(ts)
	})
	wg.Go(func() {
		tc := tls.Client(clientSide, clientCfg)
		defer tc.Close()
		if r.clientErr = tc.Handshake(); r.clientErr != nil {
			return
		}
		r.client = tc.ConnectionState()
		io.WriteString(tc, "ping\n")
		r.reply, r.clientErr = bufio.NewReader(tc).ReadString('\n')
	})

	hello, pc, err := (&Peeker{Timeout: 30 * time.Second}).Peek(edgeSide)
	if err == nil {
		r.outer = hello
		r.res, err = keys.Decrypt(hello)
	}
	if err != nil {
		r.edgeErr = err
		pc.Close()
		edgeUp.Close()
		wg.Wait()
		return r
	}
	c, b := r.res.Wrap(pc, edgeUp)
	_, _, r.edgeErr = pipe.JoinStreams(c, b, 0)
	r.hrr = c.(*echClientConn).rel.hrr
	wg.Wait()
	return r
}

// ---- Crafted hellos ----

// helloWith builds a ClientHello message with the session ID and
// extensions given.
func helloWith(sessionID []byte, exts ...ext) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8(typeClientHello)
	b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint16(tls.VersionTLS12)
		b.AddBytes(make([]byte, 32))
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(sessionID) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint16(tls.TLS_AES_128_GCM_SHA256) })
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint8(0) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			for _, e := range exts {
				b.AddUint16(e.typ)
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(e.data) })
			}
		})
	})
	return b.BytesOrPanic()
}

// encodeInner builds an EncodedClientHelloInner: a hello with an empty
// session ID and the extensions given, then padding.
func encodeInner(padding []byte, exts ...ext) []byte {
	return append(helloWith(nil, exts...)[handshakeHeaderLen:], padding...)
}

// innerECHExt is the inner encrypted_client_hello extension.
func innerECHExt() ext { return ext{extECH, []byte{byte(ECHInner)}} }

// outerExtsExt is an ech_outer_extensions extension naming types.
func outerExtsExt(types ...uint16) ext {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) {
		for _, t := range types {
			b.AddUint16(t)
		}
	})
	return ext{extECHOuterExtensions, b.BytesOrPanic()}
}

// outerECHExt is an outer encrypted_client_hello extension.
func outerECHExt(s suite, id uint8, enc, payload []byte) ext {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8(uint8(ECHOuter))
	b.AddUint16(s.kdf)
	b.AddUint16(s.aead)
	b.AddUint8(id)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(enc) })
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(payload) })
	return ext{extECH, b.BytesOrPanic()}
}

// sealer encrypts ClientHellos to an ECH key, as an ECH client does: the
// outer hello has the extensions given, then the ECH extension.
type sealer struct {
	tb     testing.TB
	id     uint8
	suite  suite
	sender *hpke.Sender
	enc    []byte
}

func newSealer(tb testing.TB, key tls.EncryptedClientHelloKey, s suite) *sealer {
	tb.Helper()
	c, err := parseECHConfig(key.Config)
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := hpke.DHKEM(ecdh.X25519()).NewPublicKey(c.publicKey)
	if err != nil {
		tb.Fatal(err)
	}
	kdf, err := hpke.NewKDF(s.kdf)
	if err != nil {
		tb.Fatal(err)
	}
	aead, err := hpke.NewAEAD(s.aead)
	if err != nil {
		tb.Fatal(err)
	}
	enc, sender, err := hpke.NewSender(pub, kdf, aead, append([]byte("tls ech\x00"), key.Config...))
	if err != nil {
		tb.Fatal(err)
	}
	return &sealer{tb: tb, id: c.id, suite: s, sender: sender, enc: enc}
}

// seal returns the outer hello that carries encoded, encrypted with the
// next sequence number. The first hello carries the encapsulated key, the
// second (after a HelloRetryRequest) none.
func (s *sealer) seal(sessionID []byte, encoded []byte, outerExts ...ext) []byte {
	overhead := 16 // the AEAD tag
	zeros := outerECHExt(s.suite, s.id, s.enc, make([]byte, len(encoded)+overhead))
	aad := helloWith(sessionID, append(outerExts, zeros)...)[handshakeHeaderLen:]
	ct, err := s.sender.Seal(aad, encoded)
	if err != nil {
		s.tb.Fatal(err)
	}
	msg := helloWith(sessionID, append(outerExts, outerECHExt(s.suite, s.id, s.enc, ct))...)
	s.enc = nil
	return msg
}

// parseMsg parses a handshake message framed in records of 2^14 bytes.
func parseMsg(tb testing.TB, msg []byte) *ClientHello {
	tb.Helper()
	h, err := Parse(reframe(msg, maxRecordLen))
	if err != nil {
		tb.Fatal(err)
	}
	return h
}
