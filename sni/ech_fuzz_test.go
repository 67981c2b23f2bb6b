package sni

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
)

// The ECH fuzz targets decrypt with a fixed key, so that the hellos sealed
// to it, in the seeds and in the corpus the fuzzer saves, keep decrypting
// from one run to the next.

type fuzzKeyT struct {
	key  tls.EncryptedClientHelloKey
	list []byte
	keys *ECHKeys
}

var fuzzKey = sync.OnceValues(func() (*fuzzKeyT, error) {
	seed := sha256.Sum256([]byte("sni ECH fuzz key"))
	priv, err := ecdh.X25519().NewPrivateKey(seed[:])
	if err != nil {
		return nil, err
	}
	key, list := echKeyOf(priv, 0x2a, publicName,
		suite{kdfHKDFSHA256, aeadAES128GCM}, suite{kdfHKDFSHA256, aeadChaCha20})
	keys, err := NewECHKeys([]tls.EncryptedClientHelloKey{key})
	if err != nil {
		return nil, err
	}
	return &fuzzKeyT{key, list, keys}, nil
})

func getFuzzKey(tb testing.TB) *fuzzKeyT {
	tb.Helper()
	k, err := fuzzKey()
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

var echSentinels = []error{ErrNoECH, ErrECHNoKey, ErrECHDecrypt, ErrMalformed, ErrInvalidName}

func echSentinel(err error) error {
	for _, s := range echSentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

// chromiumHello is a real Chromium hello with GREASE ECH, captured by
// TestECHChromiumGREASE's method: one record, as sent.
func chromiumHello(tb testing.TB) []byte {
	b, err := os.ReadFile("testdata/chromium-grease-ech.hello")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// echSeeds are hellos for the ECH fuzz targets, as sent: Go clients' hellos
// to the fuzz key, crafted ones that decrypt into valid and invalid inner
// hellos, GREASE, and hellos without ECH. (An inner hello over 2^14 bytes,
// framed in two records, is left to TestECHInnerReconstruction: a seed that
// large makes the fuzzer's minimization crawl.)
func echSeeds(tb testing.TB) [][]byte {
	k := getFuzzKey(tb)
	aes := suite{kdfHKDFSHA256, aeadAES128GCM}
	chacha := suite{kdfHKDFSHA256, aeadChaCha20}
	outerExts := []ext{sniExt(publicName), alpnExt("h2", "http/1.1"), versionsExt(tls.VersionTLS13), {0x0033, []byte("key shares")}}
	tls13 := versionsExt(tls.VersionTLS13)
	sealed := func(s suite, encoded []byte) []byte {
		return reframe(newSealer(tb, k.key, s).seal([]byte("session id"), encoded, outerExts...), maxRecordLen)
	}
	// Go clients with an X25519 key share alone: a 400-byte hello rather
	// than 1.5 KB, which the fuzzer minimizes far faster.
	small := echClient(tb, k.list)
	small.CurvePreferences = []tls.CurveID{tls.X25519}
	goECH := captureHello(tb, small)
	alpn := small.Clone()
	alpn.NextProtos = []string{"h2", "http/1.1"}
	return [][]byte{
		goECH,
		reframe(handshakeMsg(tb, goECH), 100),
		captureHello(tb, alpn),
		sealed(aes, encodeInner(make([]byte, 9), sniExt(secretName), innerECHExt(), outerExtsExt(extALPN, extSupportedVersions, 0x0033))),
		sealed(chacha, encodeInner(nil, innerECHExt(), tls13, sniExt("Secret.Example.TEST."))),
		sealed(aes, encodeInner([]byte{1}, innerECHExt(), tls13)),
		sealed(aes, encodeInner(nil, innerECHExt(), outerExtsExt(0x0033, extALPN))),
		sealed(aes, encodeInner(nil, innerECHExt(), outerExtsExt(extECH))),
		sealed(aes, encodeInner(nil, tls13)),
		sealed(aes, encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS12))),
		record(greaseHello(tb, 0x2a)),
		record(greaseHello(tb, 0x2b)),
		chromiumHello(tb),
		goHello(tb),
		record(helloWith(nil, innerECHExt(), tls13)),
		record(helloWith(nil, ext{extECH, []byte{0, 0, 1, 0, 1, 0x2a, 0, 0, 0, 1, 0}})),
		record(buildHello(sniExt(publicName), echExt())),
	}
}

// checkECHResult checks a successful decryption of outer.
func checkECHResult(t *testing.T, res *ECHResult, outer *ClientHello) {
	t.Helper()
	if res.Outer != outer {
		t.Fatal("Outer is not the hello decrypted")
	}
	checkResult(t, res.Inner, nil)
	again, err := Parse(res.Records)
	if err != nil || !bytes.Equal(again.Raw, res.Inner.Raw) || again.RecordVersion != res.Inner.RecordVersion {
		t.Fatalf("Records do not parse back to the inner hello: %v", err)
	}
	if e, err := res.Inner.ECHExtension(); err != nil || e.Type != ECHInner {
		t.Fatalf("the inner hello's ECH extension: %+v, %v", e, err)
	}
	tls13 := false
	for _, v := range res.Inner.SupportedVersions {
		if v < tls.VersionTLS13 {
			t.Fatalf("the inner hello offers %#04x", v)
		}
		tls13 = tls13 || v == tls.VersionTLS13
	}
	if !tls13 {
		t.Fatal("the inner hello does not offer TLS 1.3")
	}
	// No amplification: the inner hello is made of the encrypted one and
	// of parts of the outer one, each used once.
	if e, _ := outer.ECHExtension(); e != nil && len(res.Inner.Raw) > handshakeHeaderLen+len(e.Payload)+len(outer.Raw) {
		t.Fatalf("a %d-byte inner hello from a %d-byte outer hello", len(res.Inner.Raw), len(outer.Raw))
	}
}

// FuzzECHDecrypt feeds arbitrary bytes, as the start of a client's stream,
// to Parse, ClientHello.ECHExtension, ECHKeys.Decrypt and DecryptECH with a
// fixed key: they never panic, return only their documented errors, agree
// with each other, and what decrypts is a sound inner hello.
//
// The execs that reach the key cost an X25519 operation each, some 100 µs,
// and more under the fuzzer's instrumentation, and minimizing an input
// takes a number of execs that grows faster than its length: hence small
// seeds. Should the fuzzer still spend long stretches minimizing,
// -fuzzminimizetime 5s keeps it fuzzing.
func FuzzECHDecrypt(f *testing.F) {
	for _, seed := range echSeeds(f) {
		f.Add(seed)
	}
	k := getFuzzKey(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := Parse(data)
		if err != nil {
			return // FuzzParse's ground
		}
		e, eerr := h.ECHExtension()
		switch {
		case errors.Is(eerr, ErrNoECH):
			if h.ECH {
				t.Fatal("ECH set, ECHExtension says none")
			}
		case errors.Is(eerr, ErrMalformed):
			if !h.ECH {
				t.Fatal("ECH not set, ECHExtension malformed")
			}
		case eerr != nil || e == nil:
			t.Fatalf("ECHExtension: %v, %v", e, eerr)
		}

		res, err := k.keys.Decrypt(h)
		if err != nil {
			if res != nil {
				t.Fatal("a result with an error")
			}
			if echSentinel(err) == nil {
				t.Fatalf("error %v is none of the sentinels", err)
			}
			if eerr != nil && echSentinel(err) != echSentinel(eerr) {
				t.Fatalf("ECHExtension: %v; Decrypt: %v", eerr, err)
			}
			if e != nil && e.Type == ECHInner && !errors.Is(err, ErrNoECH) {
				t.Fatalf("an inner extension: %v, want ErrNoECH", err)
			}
			// DecryptECH agrees. (Only where no key was tried: where one
			// was, it would double the cost of an exec, and the unit
			// tests compare them.)
			if !errors.Is(err, ErrECHDecrypt) {
				if res2, err2 := DecryptECH(h, []tls.EncryptedClientHelloKey{k.key}); res2 != nil || echSentinel(err2) != echSentinel(err) {
					t.Fatalf("Decrypt: %v; DecryptECH: %v", err, err2)
				}
			}
			return
		}
		checkECHResult(t, res, h)
		// The first hello carries an encapsulated key: it cannot be its
		// own retry.
		if _, err := res.DecryptRetry(h); !errors.Is(err, ErrMalformed) {
			t.Fatalf("DecryptRetry of the first hello: %v, want ErrMalformed", err)
		}
	})
}

// openEncoded decrypts the EncodedClientHelloInner of h, sealed to the
// first of keys.
func openEncoded(tb testing.TB, keys *ECHKeys, h *ClientHello) []byte {
	tb.Helper()
	p, e, err := outerECH(h)
	if err != nil {
		tb.Fatal(err)
	}
	kdf, _ := hpke.NewKDF(e.KDF)
	aead, _ := hpke.NewAEAD(e.AEAD)
	k := keys.keys[0]
	ctx, err := hpke.NewRecipient(e.Enc, k.priv, kdf, aead, k.info)
	if err != nil {
		tb.Fatal(err)
	}
	encoded, err := ctx.Open(p.aad(e), e.Payload)
	if err != nil {
		tb.Fatal(err)
	}
	return encoded
}

// FuzzECHInner rebuilds inner hellos from arbitrary EncodedClientHelloInner
// bytes against real outer hellos: no panic, only ErrMalformed and
// ErrInvalidName, and what it accepts is a sound inner hello, no larger
// than its two sources.
func FuzzECHInner(f *testing.F) {
	k := getFuzzKey(f)
	var outers []*ClientHello
	for _, rec := range [][]byte{
		captureHello(f, echClient(f, k.list)),
		record(helloWith([]byte("session id"), sniExt(publicName), alpnExt("h2"), versionsExt(tls.VersionTLS13), ext{0x0033, []byte("shares")}, ext{0x0a0a, nil})),
		chromiumHello(f),
	} {
		h, err := Parse(rec)
		if err != nil {
			f.Fatal(err)
		}
		outers = append(outers, h)
	}
	tls13 := versionsExt(tls.VersionTLS13)
	f.Add(openEncoded(f, k.keys, outers[0]), uint8(0))
	for _, encoded := range [][]byte{
		encodeInner(make([]byte, 31), sniExt(secretName), innerECHExt(), outerExtsExt(extALPN, extSupportedVersions, 0x0033)),
		encodeInner(nil, innerECHExt(), outerExtsExt(extServerName), outerExtsExt(0x0033)),
		encodeInner(nil, innerECHExt(), tls13, outerExtsExt(0x0a0a)),
		encodeInner(nil, innerECHExt(), outerExtsExt(0x0033, extALPN)),
		encodeInner(nil, innerECHExt(), outerExtsExt(extALPN, extALPN)),
		encodeInner(nil, innerECHExt(), outerExtsExt(extECH)),
		encodeInner([]byte{0, 1}, innerECHExt(), tls13),
		encodeInner(nil, tls13),
		helloWith([]byte{1}, innerECHExt(), tls13)[handshakeHeaderLen:],
		{},
	} {
		for i := range outers {
			f.Add(encoded, uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, encoded []byte, which uint8) {
		outer := outers[int(which)%len(outers)]
		p, err := splitHello(outer)
		if err != nil {
			t.Fatal(err)
		}
		res, err := newECHResult(outer, p, encoded)
		if err != nil {
			if res != nil {
				t.Fatal("a result with an error")
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidName) {
				t.Fatalf("error %v, want ErrMalformed or ErrInvalidName", err)
			}
			return
		}
		checkECHResult(t, res, outer)
		if len(res.Inner.Raw) > handshakeHeaderLen+len(encoded)+len(outer.Raw) {
			t.Fatalf("a %d-byte inner hello from %d encoded bytes", len(res.Inner.Raw), len(encoded))
		}
	})
}

// FuzzECHWrap relays arbitrary client bytes after a real outer hello, and
// arbitrary backend bytes, through Wrap, read in pieces of chunk+1 bytes:
// no panic, no hang; the backend's bytes pass untouched; without a
// HelloRetryRequest the client's bytes pass untouched after the inner
// hello; errors are the relay's own. Seeds include a second hello that
// decrypts.
func FuzzECHWrap(f *testing.F) {
	k := getFuzzKey(f)
	outerExts := []ext{sniExt(publicName), versionsExt(tls.VersionTLS13)}
	encoded := encodeInner(nil, sniExt(secretName), innerECHExt(), outerExtsExt(extSupportedVersions))
	sl := newSealer(f, k.key, suite{kdfHKDFSHA256, aeadAES128GCM})
	outerMsg := sl.seal(nil, encoded, outerExts...)
	second := sl.seal(nil, encoded, outerExts...)
	outer := parseMsg(f, outerMsg)
	ccs := []byte{recordTypeChangeCipherSpec, 3, 3, 0, 1, 1}
	serverHello := bytes.Clone(hrrBytes())
	serverHello[recordHeaderLen+handshakeHeaderLen+2] ^= 1

	for _, after := range [][]byte{
		append(bytes.Clone(ccs), record(second)...),
		append(recordOf(23, []byte("early")), reframe(second, 7)...),
		record(second)[:40],
		record(helloWith(nil, outerExts...)),
		[]byte("plain bytes"),
		{},
	} {
		for _, backend := range [][]byte{hrrBytes(), reframe(hrrBytes()[recordHeaderLen:], 2), serverHello, {21, 3, 3, 0, 2, 2, 40}, {}} {
			f.Add(after, backend, uint8(0))
			f.Add(after, backend, uint8(200))
		}
	}
	f.Fuzz(func(t *testing.T, after, backend []byte, chunk uint8) {
		res, err := k.keys.Decrypt(outer) // a fresh HPKE context
		if err != nil {
			t.Fatal(err)
		}
		stream := append(record(outerMsg), after...)
		size := max(int(chunk)+1, len(stream)/64, len(backend)/64)
		client := &recordConn{Conn: newScript(nil, io.EOF, chunked(stream, size)...)}
		c, b := res.Wrap(client, newScript(nil, io.EOF, chunked(backend, size)...))
		defer c.Close()
		defer b.Close()
		if got, err := io.ReadAll(b); err != nil || !bytes.Equal(got, backend) {
			t.Fatalf("backend bytes % x, %v; want % x", got, err, backend)
		}
		got, err := io.ReadAll(c)
		hrr := c.(*echClientConn).rel.hrr
		if !hrr {
			if want := append(bytes.Clone(res.Records), after...); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("no HRR: the backend got % x, %v; want % x", got, err, want)
			}
			if len(client.written) != 0 {
				t.Fatalf("no HRR, yet % x written to the client", client.written)
			}
			return
		}
		if !bytes.HasPrefix(got, res.Records) {
			t.Fatal("the backend did not get the inner hello first")
		}
		if err != nil && !relayError(err) {
			t.Fatalf("error %v is not the relay's", err)
		}
		if len(client.written) != 0 && (err == nil || len(client.written) != 7 || client.written[0] != recordTypeAlert) {
			t.Fatalf("% x written to the client, error %v", client.written, err)
		}
	})
}
