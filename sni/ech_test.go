package sni

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"golang.org/x/crypto/cryptobyte"
)

// ---- Split mode with real crypto/tls clients and servers ----

// A Go client with the ECHConfigList connects, through an edge that
// decrypts its hello, to a plain crypto/tls server holding no ECH key and a
// certificate for the inner name alone: the handshake completes with ECH
// accepted on both ends, and data flows. Over net.Pipe and TCP, with each
// cipher suite the key offers.
func TestECHSplitMode(t *testing.T) {
	aes := suite{kdfHKDFSHA256, aeadAES128GCM}
	chacha := suite{kdfHKDFSHA256, aeadChaCha20}
	aes256 := suite{kdfHKDFSHA256, 0x0002}
	for _, transport := range transports {
		for _, s := range []suite{aes, chacha, aes256} {
			t.Run(fmt.Sprintf("%s/aead=%d", transport, s.aead), func(t *testing.T) {
				testwait.NoLeak(t, 0)
				// The client picks the first suite of the configuration.
				key, list := testECHKey(t, 42, publicName, s, aes)
				keys, err := NewECHKeys([]tls.EncryptedClientHelloKey{key})
				if err != nil {
					t.Fatal(err)
				}
				r := runSplit(t, transport, echClient(t, list), backendConfig(t), keys)
				checkAccepted(t, r)
				if r.hrr {
					t.Error("a HelloRetryRequest, want none")
				}
				if e, err := r.outer.ECHExtension(); err != nil || e.AEAD != s.aead || e.ConfigID != 42 {
					t.Errorf("outer extension %+v, %v; want AEAD %d, config_id 42", e, err, s.aead)
				}
			})
		}
	}
}

// checkAccepted checks that a split-mode run went through with ECH.
func checkAccepted(t *testing.T, r *splitRun) {
	t.Helper()
	// The relay's own errors fail the test. Others are teardown: as the
	// client and backend close their ends, the edge's last reads and
	// writes can meet a closed pipe or a reset (a client that closes with
	// a session ticket unread resets the TCP connection).
	if r.clientErr != nil || r.backendErr != nil || relayError(r.edgeErr) {
		t.Fatalf("edge: %v; client: %v; backend: %v", r.edgeErr, r.clientErr, r.backendErr)
	}
	if r.outer.ServerName != publicName || !r.outer.ECH {
		t.Errorf("outer name %q, ECH %v; want %q, true", r.outer.ServerName, r.outer.ECH, publicName)
	}
	if r.res.Outer != r.outer || r.res.Inner.ServerName != secretName {
		t.Errorf("inner name %q, want %q", r.res.Inner.ServerName, secretName)
	}
	// The backend signals acceptance in its ServerHello, which the client
	// checks. Go 1.26's server reports ECHAccepted only when it decrypted
	// the hello itself, not as a split-mode backend: what shows that it
	// acted as one is the inner extension in the hello it got.
	if !r.client.ECHAccepted || !r.backendECH {
		t.Errorf("client: ECH accepted %v; backend got the inner ECH extension: %v; want both", r.client.ECHAccepted, r.backendECH)
	}
	if r.backend.ServerName != secretName {
		t.Errorf("backend saw name %q, want %q", r.backend.ServerName, secretName)
	}
	if certs := r.client.PeerCertificates; len(certs) == 0 || certs[0].VerifyHostname(secretName) != nil || certs[0].VerifyHostname(publicName) == nil {
		t.Error("the client did not get the certificate of the inner name alone")
	}
	if r.reply != "pong\n" {
		t.Errorf("client read %q, want pong", r.reply)
	}
}

// relayError reports whether err is one of those the conns of Wrap return
// themselves, rather than an error of the underlying conns.
func relayError(err error) bool {
	for _, e := range []error{ErrMalformed, ErrInvalidName, ErrTooLarge, ErrNoECH, ErrECHDecrypt, errNotOuter, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// The backend accepts only P-256, which the client offers without a key
// share, so it answers the first hello with a HelloRetryRequest: the
// client's second hello is decrypted with the same HPKE context, and the
// handshake completes with ECH accepted on both ends.
func TestECHSplitModeHelloRetryRequest(t *testing.T) {
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			testwait.NoLeak(t, 0)
			h := getHeldKey(t)
			backend := backendConfig(t)
			backend.CurvePreferences = []tls.CurveID{tls.CurveP256}
			r := runSplit(t, transport, echClient(t, h.list), backend, h.keys)
			checkAccepted(t, r)
			if !r.hrr {
				t.Error("no HelloRetryRequest seen")
			}
			if r.client.CurveID != tls.CurveP256 {
				t.Errorf("key exchange %v, want P-256", r.client.CurveID)
			}
		})
	}
}

// Go clients send a legacy_session_id (TLS 1.3's middlebox compatibility
// mode), which the encoded inner hello leaves out: it is copied back from
// the outer hello. After a HelloRetryRequest they also send a
// ChangeCipherSpec record before their second hello, which goes through
// untouched.
func TestECHSplitModeSessionIDAndCCS(t *testing.T) {
	testwait.NoLeak(t, 0)
	h := getHeldKey(t)
	backend := backendConfig(t)
	backend.CurvePreferences = []tls.CurveID{tls.CurveP256}
	r := runSplit(t, "tcp", echClient(t, h.list), backend, h.keys)
	checkAccepted(t, r)
	op, _ := splitHello(r.outer)
	ip, _ := splitHello(r.res.Inner)
	if len(op.sessionID) == 0 || !bytes.Equal(op.sessionID, ip.sessionID) {
		t.Errorf("session IDs: outer % x, inner % x; want equal, not empty", op.sessionID, ip.sessionID)
	}
}

// A client whose configuration is stale (a key the edge no longer holds)
// gets ErrECHNoKey: the edge then serves the outer hello as the
// client-facing server for the public name, with crypto/tls holding the
// current key as a retry configuration. The client gets
// tls.ECHRejectionError with that configuration, retries with it, and
// gets through in split mode.
func TestECHStaleConfig(t *testing.T) {
	testwait.NoLeak(t, 0)
	h := getHeldKey(t)
	_, staleList := testECHKey(t, configID(t, h.key.Config)+1, publicName, suite{kdfHKDFSHA256, aeadAES128GCM})

	r := runSplit(t, "pipe", echClient(t, staleList), backendConfig(t), h.keys)
	if !errors.Is(r.edgeErr, ErrECHNoKey) {
		t.Fatalf("edge: %v, want ErrECHNoKey", r.edgeErr)
	}
	if r.outer.ServerName != publicName {
		t.Errorf("outer name %q, want %q", r.outer.ServerName, publicName)
	}

	// The edge as client-facing server. (Over TCP: after the rejection,
	// both ends write an alert, which a net.Pipe would block until
	// crypto/tls's 5-second close deadline.)
	clientSide, edgeSide := connPair(t, "tcp")
	done := make(chan error, 1)
	go func() {
		hello, pc, err := Peek(edgeSide)
		if err == nil {
			_, err = h.keys.Decrypt(hello)
		}
		if !errors.Is(err, ErrECHNoKey) {
			done <- fmt.Errorf("decrypt: %v, want ErrECHNoKey", err)
			pc.Close()
			return
		}
		ts := tls.Server(pc, &tls.Config{
			Certificates:             []tls.Certificate{getPKI(t).cert}, // for publicName
			EncryptedClientHelloKeys: []tls.EncryptedClientHelloKey{h.key},
		})
		err = ts.Handshake()
		ts.Close()
		done <- err
	}()
	err := tls.Client(clientSide, echClient(t, staleList)).Handshake()
	clientSide.Close()
	var rej *tls.ECHRejectionError
	if !errors.As(err, &rej) || !bytes.Equal(rej.RetryConfigList, h.list) {
		t.Fatalf("client: %v; want an ECHRejectionError with the current configuration", err)
	}
	if err := <-done; err != nil {
		t.Logf("client-facing server: %v (the client aborts once it has the retry configuration)", err)
	}

	r = runSplit(t, "pipe", echClient(t, rej.RetryConfigList), backendConfig(t), h.keys)
	checkAccepted(t, r)
}

// ---- GREASE ----

// greaseHello returns Go's default hello for appName with a GREASE ECH
// extension added, as Chromium sends: a random config_id, encapsulated key
// and payload.
func greaseHello(tb testing.TB, id uint8) []byte {
	p, err := splitHello(&ClientHello{Raw: handshakeMsg(tb, goHello(tb))})
	if err != nil {
		tb.Fatal(err)
	}
	var exts []ext
	for e := p.extensions; !e.Empty(); {
		typ, data := next(&e)
		exts = append(exts, ext{typ, data})
	}
	enc := make([]byte, 32)
	payload := make([]byte, 144+16)
	rand.Read(enc)
	rand.Read(payload)
	exts = append(exts, outerECHExt(suite{kdfHKDFSHA256, aeadAES128GCM}, id, enc, payload))
	return helloWith(p.sessionID, exts...)
}

// GREASE ECH parses as an outer extension whose config_id matches no key:
// ErrECHNoKey, or ErrECHDecrypt when the random config_id happens to be
// the key's; either way the outer name is there to route by.
func TestECHGREASE(t *testing.T) {
	h := getHeldKey(t)
	id := configID(t, h.key.Config)
	for _, tc := range []struct {
		id   uint8
		want error
	}{{id + 1, ErrECHNoKey}, {id, ErrECHDecrypt}} {
		hello := parseMsg(t, greaseHello(t, tc.id))
		if !hello.ECH || hello.ServerName != appName {
			t.Errorf("ECH %v, name %q; want true, %q", hello.ECH, hello.ServerName, appName)
		}
		e, err := hello.ECHExtension()
		if err != nil || e.Type != ECHOuter || e.ConfigID != tc.id || len(e.Enc) != 32 {
			t.Errorf("extension %+v, %v", e, err)
		}
		if res, err := h.keys.Decrypt(hello); !errors.Is(err, tc.want) || res != nil {
			t.Errorf("config_id %d: %v, %v; want %v", tc.id, res, err, tc.want)
		}
		if _, err := DecryptECH(hello, []tls.EncryptedClientHelloKey{h.key}); !errors.Is(err, tc.want) {
			t.Errorf("DecryptECH, config_id %d: %v; want %v", tc.id, err, tc.want)
		}
		var none *ECHKeys
		if _, err := none.Decrypt(hello); !errors.Is(err, ErrECHNoKey) {
			t.Errorf("no keys: %v, want ErrECHNoKey", err)
		}
	}
}

// Chromium sends GREASE ECH on every connection: its real hello gives
// ErrECHNoKey (or ErrECHDecrypt), and routes by its SNI.
func TestECHChromiumGREASE(t *testing.T) {
	chromium := lookPath(t, "chromium")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		defer close(got)
		c, err := ln.Accept()
		ln.Close() // Chromium's retries are refused at once
		if err != nil {
			return
		}
		defer c.Close()
		hello, _, err := Peek(c)
		if err == nil {
			got <- record(hello.Raw)
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	cmd := chromiumCmd(t, chromium, "https://grease.example.test:"+port+"/")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Chromium gives up on the page and exits once the conn is closed,
	// with its helper processes, before its profile directory goes.
	t.Cleanup(func() {
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its process group
			<-exited
		}
	})
	var rec []byte
	select {
	case rec = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("no hello from Chromium")
	}
	if rec == nil {
		t.Fatal("Chromium's hello did not parse")
	}
	hello, err := Parse(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !hello.ECH || hello.ServerName != "grease.example.test" {
		t.Fatalf("ECH %v, name %q; want GREASE ECH and grease.example.test", hello.ECH, hello.ServerName)
	}
	e, err := hello.ECHExtension()
	if err != nil || e.Type != ECHOuter {
		t.Fatalf("extension %+v, %v; want an outer one", e, err)
	}
	_, err = getHeldKey(t).keys.Decrypt(hello)
	if !errors.Is(err, ErrECHNoKey) && !errors.Is(err, ErrECHDecrypt) {
		t.Errorf("decrypt: %v, want ErrECHNoKey or ErrECHDecrypt", err)
	}
	t.Logf("Chromium: %d-byte hello, GREASE ECH config_id %d, suite %#04x/%#04x, enc %d bytes, payload %d bytes",
		len(hello.Raw), e.ConfigID, e.KDF, e.AEAD, len(e.Enc), len(e.Payload))
}

// chromiumCmd is headless Chromium loading url, with every name of
// example.test resolving to loopback, in a process group of its own.
func chromiumCmd(t *testing.T, chromium, url string) *exec.Cmd {
	cmd := exec.Command(chromium,
		"--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--user-data-dir="+t.TempDir(),
		"--host-resolver-rules=MAP *.example.test 127.0.0.1",
		"--dump-dom", url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// ---- The ECH extension ----

func TestECHExtension(t *testing.T) {
	h := getHeldKey(t)
	goECH := parseMsg(t, handshakeMsg(t, captureHello(t, echClient(t, h.list))))
	e, err := goECH.ECHExtension()
	if err != nil || e.Type != ECHOuter || e.ConfigID != configID(t, h.key.Config) ||
		e.KDF != kdfHKDFSHA256 || e.AEAD != aeadAES128GCM || len(e.Enc) != 32 || len(e.Payload) == 0 {
		t.Errorf("Go's ECH hello: %+v, %v", e, err)
	}
	if _, err := parseMsg(t, handshakeMsg(t, goHello(t))).ECHExtension(); !errors.Is(err, ErrNoECH) {
		t.Errorf("no extension: %v, want ErrNoECH", err)
	}
	inner := parseMsg(t, helloWith(nil, innerECHExt()))
	if e, err := inner.ECHExtension(); err != nil || e.Type != ECHInner {
		t.Errorf("inner: %+v, %v", e, err)
	}
	if _, err := getHeldKey(t).keys.Decrypt(inner); !errors.Is(err, ErrNoECH) {
		t.Errorf("decrypting an inner hello: %v, want ErrNoECH", err)
	}
	for name, data := range map[string][]byte{
		"empty":                {},
		"unknown type":         {2},
		"inner with content":   {1, 0},
		"outer truncated":      {0, 0, 1, 0, 1, 7, 0},
		"outer, empty payload": {0, 0, 1, 0, 1, 7, 0, 0, 0, 0},
		"outer, trailing byte": {0, 0, 1, 0, 1, 7, 0, 0, 0, 1, 9, 9},
	} {
		h := parseMsg(t, helloWith(nil, ext{extECH, data}))
		if _, err := h.ECHExtension(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
		if _, err := getHeldKey(t).keys.Decrypt(h); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decrypt: %v, want ErrMalformed", name, err)
		}
	}
	var nilHello *ClientHello
	if _, err := nilHello.ECHExtension(); !errors.Is(err, ErrMalformed) {
		t.Errorf("nil hello: %v", err)
	}
}

// The associated data is ClientHelloOuterAAD exactly as crypto/tls's client
// computes it (the hello without its handshake header, the payload
// zeroed); that Go clients' hellos decrypt proves it too.
func TestECHAAD(t *testing.T) {
	h := getHeldKey(t)
	for range 5 {
		msg := handshakeMsg(t, captureHello(t, echClient(t, h.list)))
		hello := parseMsg(t, msg)
		p, ext, err := outerECH(hello)
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.Replace(msg[4:], ext.Payload, make([]byte, len(ext.Payload)), 1)
		if got := p.aad(ext); !bytes.Equal(got, want) {
			t.Fatalf("AAD differs from crypto/tls's")
		}
		if _, err := h.keys.Decrypt(hello); err != nil {
			t.Fatal(err)
		}
	}
}

// ---- Inner hello reconstruction ----

func TestECHInnerReconstruction(t *testing.T) {
	h := getHeldKey(t)
	s := suite{kdfHKDFSHA256, aeadAES128GCM}
	sid := bytes.Repeat([]byte{0xab}, 32)
	outerExts := []ext{sniExt(publicName), alpnExt("h2"), versionsExt(tls.VersionTLS13), {0x0a0a, []byte("grease")}, {0x0033, []byte("shares")}}

	// Extensions named in ech_outer_extensions are copied from the outer
	// hello, in place, and the session ID is the outer one.
	encoded := encodeInner(make([]byte, 17),
		sniExt(secretName), innerECHExt(), outerExtsExt(extALPN, extSupportedVersions, 0x0033), ext{0x1234, []byte("x")})
	outer := parseMsg(t, newSealer(t, h.key, s).seal(sid, encoded, outerExts...))
	res, err := h.keys.Decrypt(outer)
	if err != nil {
		t.Fatal(err)
	}
	want := helloWith(sid, sniExt(secretName), innerECHExt(), alpnExt("h2"), versionsExt(tls.VersionTLS13), ext{0x0033, []byte("shares")}, ext{0x1234, []byte("x")})
	if !bytes.Equal(res.Inner.Raw, want) {
		t.Errorf("inner hello\n% x\nwant\n% x", res.Inner.Raw, want)
	}
	if res.Inner.ServerName != secretName || res.Inner.ALPN[0] != "h2" || res.Outer.ServerName != publicName {
		t.Errorf("inner %q %q, outer %q", res.Inner.ServerName, res.Inner.ALPN, res.Outer.ServerName)
	}
	if !bytes.Equal(res.Records, record(want)) {
		t.Error("Records is not the inner hello in one record")
	}

	// An inner hello of more than 2^14 bytes is framed in two records.
	big := ext{0x4444, bytes.Repeat([]byte{'b'}, 20000)}
	outer = parseMsg(t, newSealer(t, h.key, s).seal(nil, encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS13), big), outerExts...))
	res, err = h.keys.Decrypt(outer)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Parse(res.Records); err != nil || !bytes.Equal(again.Raw, res.Inner.Raw) {
		t.Errorf("Records do not parse back to the inner hello: %v", err)
	}
	if n := len(res.Records) - len(res.Inner.Raw); n != 2*recordHeaderLen {
		t.Errorf("Records has %d bytes of headers, want two records", n)
	}

	bad := map[string]struct {
		encoded []byte
		want    error
	}{
		"nonzero padding":         {encodeInner([]byte{0, 0, 1}, innerECHExt(), versionsExt(tls.VersionTLS13)), ErrMalformed},
		"session ID":              {helloWith([]byte{1}, innerECHExt(), versionsExt(tls.VersionTLS13))[4:], ErrMalformed},
		"truncated":               {encodeInner(nil, innerECHExt())[:40], ErrMalformed},
		"missing outer extension": {encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS13), outerExtsExt(0x7777)), ErrMalformed},
		"out of order":            {encodeInner(nil, innerECHExt(), outerExtsExt(0x0033, extALPN)), ErrMalformed},
		"named twice":             {encodeInner(nil, innerECHExt(), outerExtsExt(extALPN, extALPN)), ErrMalformed},
		"named in two lists":      {encodeInner(nil, innerECHExt(), outerExtsExt(0x0033), outerExtsExt(extALPN)), ErrMalformed},
		"names ECH":               {encodeInner(nil, innerECHExt(), outerExtsExt(extECH)), ErrMalformed},
		"empty list":              {encodeInner(nil, innerECHExt(), outerExtsExt()), ErrMalformed},
		"no inner ECH extension":  {encodeInner(nil, versionsExt(tls.VersionTLS13)), ErrMalformed},
		"outer ECH inside":        {encodeInner(nil, outerECHExt(s, 1, nil, []byte{1}), versionsExt(tls.VersionTLS13)), ErrMalformed},
		"offers TLS 1.2":          {encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS13, tls.VersionTLS12)), ErrMalformed},
		"no TLS 1.3":              {encodeInner(nil, innerECHExt()), ErrMalformed},
		"two inner names":         {encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS13), sniExt("a.example", "b.example")), ErrMalformed},
		"IP literal":              {encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS13), sniExt("192.0.2.1")), ErrInvalidName},
		"repeated ALPN":           {encodeInner(nil, innerECHExt(), versionsExt(tls.VersionTLS13), alpnExt("h2"), outerExtsExt(extALPN)), ErrMalformed},
	}
	for name, tc := range bad {
		outer := parseMsg(t, newSealer(t, h.key, s).seal(nil, tc.encoded, outerExts...))
		if res, err := h.keys.Decrypt(outer); !errors.Is(err, tc.want) || res != nil {
			t.Errorf("%s: %v; want %v", name, err, tc.want)
		}
	}
}

// A hello altered on the way fails to decrypt: the whole outer hello is
// authenticated.
func TestECHTampered(t *testing.T) {
	h := getHeldKey(t)
	msg := handshakeMsg(t, captureHello(t, echClient(t, h.list)))
	name := bytes.Index(msg, []byte(publicName))
	for _, at := range []int{10, name, len(msg) - 1} {
		m := bytes.Clone(msg)
		m[at] ^= 1
		hello, err := Parse(record(m))
		if err != nil {
			continue // the change broke the framing or the name
		}
		if _, err := h.keys.Decrypt(hello); !errors.Is(err, ErrECHDecrypt) {
			t.Errorf("byte %d flipped: %v, want ErrECHDecrypt", at, err)
		}
	}
}

// ---- DecryptRetry ----

func TestECHDecryptRetry(t *testing.T) {
	h := getHeldKey(t)
	s := suite{kdfHKDFSHA256, aeadAES128GCM}
	outerExts := []ext{sniExt(publicName), versionsExt(tls.VersionTLS13)}
	encoded := func(name string) []byte {
		return encodeInner(nil, sniExt(name), innerECHExt(), outerExtsExt(extSupportedVersions))
	}
	first := func() (*sealer, *ECHResult) {
		sl := newSealer(t, h.key, s)
		res, err := h.keys.Decrypt(parseMsg(t, sl.seal(nil, encoded(secretName), outerExts...)))
		if err != nil {
			t.Fatal(err)
		}
		return sl, res
	}

	sl, res := first()
	second := parseMsg(t, sl.seal(nil, encoded("retry.example.test"), outerExts...))
	if _, err := h.keys.Decrypt(second); !errors.Is(err, ErrECHDecrypt) {
		t.Errorf("second hello without the first's context: %v, want ErrECHDecrypt", err)
	}
	res2, err := res.DecryptRetry(second)
	if err != nil || res2.Inner.ServerName != "retry.example.test" {
		t.Fatalf("DecryptRetry: %v, %v", res2, err)
	}
	if _, err := res.DecryptRetry(second); err == nil {
		t.Error("DecryptRetry twice: no error")
	}
	if _, err := res2.DecryptRetry(second); err == nil {
		t.Error("DecryptRetry on a retry's result: no error")
	}

	// The second hello's extension must keep the configuration and
	// suite, and carry no encapsulated key.
	sl, res = first()
	sl.enc = []byte{1, 2, 3}
	if _, err := res.DecryptRetry(parseMsg(t, sl.seal(nil, encoded(secretName), outerExts...))); !errors.Is(err, ErrMalformed) {
		t.Errorf("with an encapsulated key: %v, want ErrMalformed", err)
	}
	sl, res = first()
	sl.id++
	if _, err := res.DecryptRetry(parseMsg(t, sl.seal(nil, encoded(secretName), outerExts...))); !errors.Is(err, ErrMalformed) {
		t.Errorf("another config_id: %v, want ErrMalformed", err)
	}
	_, res = first()
	if _, err := res.DecryptRetry(parseMsg(t, helloWith(nil, outerExts...))); !errors.Is(err, ErrNoECH) {
		t.Errorf("no extension: %v, want ErrNoECH", err)
	}
	_, res = first()
	if _, err := res.DecryptRetry(parseMsg(t, greaseHello(t, configID(t, h.key.Config)))); !errors.Is(err, ErrMalformed) {
		t.Errorf("a GREASE second hello: %v, want ErrMalformed (it has an encapsulated key)", err)
	}
}

// ---- Keys ----

func TestNewECHKey(t *testing.T) {
	key, list, err := NewECHKey("Public.Example.COM.")
	if err != nil {
		t.Fatal(err)
	}
	if !key.SendAsRetry {
		t.Error("SendAsRetry not set")
	}
	s := cryptobyte.String(list)
	var config cryptobyte.String
	if !s.ReadUint16LengthPrefixed(&config) || !s.Empty() || !bytes.Equal(config, key.Config) {
		t.Error("the list is not the configuration alone")
	}
	c, err := parseECHConfig(key.Config)
	if err != nil || c.kem != kemX25519 || !c.offers(kdfHKDFSHA256, aeadAES128GCM) || !c.offers(kdfHKDFSHA256, aeadChaCha20) {
		t.Errorf("config %+v, %v", c, err)
	}
	if !bytes.Contains(key.Config, []byte("\x12public.example.com\x00\x00")) {
		t.Errorf("the config does not end with the normalised public name and no extensions: % x", key.Config)
	}
	if _, err := NewECHKeys([]tls.EncryptedClientHelloKey{key}); err != nil {
		t.Error(err)
	}
	// crypto/tls's client takes the list.
	if hello := parseMsg(t, handshakeMsg(t, captureHello(t, echClient(t, list)))); hello.ServerName != "public.example.com" {
		t.Errorf("Go client's outer name %q", hello.ServerName)
	}
	for _, bad := range []string{"", "localhost", "192.0.2.1", "under_score.example", "-a.example", "a-.example", "a..example", "exa mple.com"} {
		if _, _, err := NewECHKey(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("public name %q: %v, want ErrInvalidName", bad, err)
		}
	}
	// Key IDs are random.
	ids := map[uint8]bool{}
	for range 20 {
		k, _, _ := NewECHKey(publicName)
		ids[configID(t, k.Config)] = true
	}
	if len(ids) < 2 {
		t.Error("20 keys, one config_id")
	}
}

func TestNewECHKeysErrors(t *testing.T) {
	h := getHeldKey(t)
	other, _, _ := NewECHKey(publicName)
	config := func(f func(*cryptobyte.Builder)) []byte {
		b := cryptobyte.NewBuilder(nil)
		f(b)
		return b.BytesOrPanic()
	}
	for name, k := range map[string]tls.EncryptedClientHelloKey{
		"empty config":  {PrivateKey: h.key.PrivateKey},
		"trailing byte": {Config: append(bytes.Clone(h.key.Config), 0), PrivateKey: h.key.PrivateKey},
		"truncated":     {Config: h.key.Config[:len(h.key.Config)-1], PrivateKey: h.key.PrivateKey},
		"other key":     {Config: h.key.Config, PrivateKey: other.PrivateKey},
		"short key":     {Config: h.key.Config, PrivateKey: h.key.PrivateKey[:31]},
		"old version":   {Config: config(func(b *cryptobyte.Builder) { b.AddUint16(0xfe0a); b.AddUint16(0) }), PrivateKey: h.key.PrivateKey},
		"unknown KEM":   {Config: bytes.Replace(bytes.Clone(h.key.Config), []byte{0, 0x20, 0, 32}, []byte{0x77, 0x77, 0, 32}, 1), PrivateKey: h.key.PrivateKey},
		"no cipher suites": {Config: config(func(b *cryptobyte.Builder) {
			b.AddUint16(0xfe0d)
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte{1, 0, 0x20, 0, 1, 9, 0, 0, 0, 1, 'x', 0, 0}) })
		}), PrivateKey: h.key.PrivateKey},
	} {
		if _, err := NewECHKeys([]tls.EncryptedClientHelloKey{k}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if ks, err := NewECHKeys(nil); err != nil || ks == nil {
		t.Errorf("no keys: %v, %v", ks, err)
	}
}

// DecryptECH gives what ECHKeys.Decrypt gives, and tries every key with
// the hello's config_id.
func TestDecryptECH(t *testing.T) {
	h := getHeldKey(t)
	id := configID(t, h.key.Config)
	aes := suite{kdfHKDFSHA256, aeadAES128GCM}
	decoy, _ := testECHKey(t, id, publicName, aes) // same config_id, another key
	other, _ := testECHKey(t, id+1, publicName, aes)
	hello := parseMsg(t, handshakeMsg(t, captureHello(t, echClient(t, h.list))))
	res, err := DecryptECH(hello, []tls.EncryptedClientHelloKey{other, decoy, h.key})
	if err != nil || res.Inner.ServerName != secretName {
		t.Fatalf("%v, %v", res, err)
	}
	keys, err := NewECHKeys([]tls.EncryptedClientHelloKey{other, decoy, h.key})
	if err != nil {
		t.Fatal(err)
	}
	res2, err := keys.Decrypt(hello)
	if err != nil || !bytes.Equal(res2.Inner.Raw, res.Inner.Raw) || !bytes.Equal(res2.Records, res.Records) {
		t.Fatalf("ECHKeys.Decrypt: %v", err)
	}
	if _, err := DecryptECH(hello, []tls.EncryptedClientHelloKey{decoy}); !errors.Is(err, ErrECHDecrypt) {
		t.Errorf("only a decoy: %v, want ErrECHDecrypt", err)
	}
	// A key that offers another suite is not tried.
	chachaOnly, _ := testECHKey(t, id, publicName, suite{kdfHKDFSHA256, aeadChaCha20})
	if _, err := DecryptECH(hello, []tls.EncryptedClientHelloKey{chachaOnly}); !errors.Is(err, ErrECHNoKey) {
		t.Errorf("suite not offered: %v, want ErrECHNoKey", err)
	}
	if _, err := DecryptECH(hello, []tls.EncryptedClientHelloKey{{Config: []byte{1}}}); err == nil || errors.Is(err, ErrECHNoKey) {
		t.Errorf("malformed key: %v", err)
	}
}

// ---- Wrap ----

// hrrBytes is the start of a HelloRetryRequest record.
func hrrBytes() []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddUint8(recordTypeHandshake)
	b.AddUint16(tls.VersionTLS12)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint8(typeServerHello)
		b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint16(tls.VersionTLS12)
			b.AddBytes(helloRetryRandom[:])
			b.AddBytes(make([]byte, 40))
		})
	})
	return b.BytesOrPanic()
}

func TestHelloRetryRandom(t *testing.T) {
	if sha256.Sum256([]byte("HelloRetryRequest")) != helloRetryRandom {
		t.Fatal("helloRetryRandom is not SHA-256 of HelloRetryRequest")
	}
}

func TestHRRDetector(t *testing.T) {
	hrr := hrrBytes()
	sh := bytes.Clone(hrr)
	sh[5+4+2] ^= 1 // another random: a ServerHello
	msg := hrr[recordHeaderLen:]
	for name, tc := range map[string]struct {
		stream []byte
		hrr    bool
	}{
		"HelloRetryRequest":  {hrr, true},
		"in 1-byte records":  {reframe(msg, 1), true},
		"in 7-byte records":  {reframe(msg, 7), true},
		"ServerHello":        {sh, false},
		"alert":              {[]byte{recordTypeAlert, 3, 3, 0, 2, 2, 40}, false},
		"empty record":       {[]byte{recordTypeHandshake, 3, 3, 0, 0}, false},
		"CCS inside":         {append(record(msg[:10]), recordOf(recordTypeChangeCipherSpec, []byte{1})...), false},
		"another message":    {record(append([]byte{11}, msg[1:]...)), false},
		"HTTP":               {[]byte("HTTP/1.1 400 Bad Request\r\n\r\n"), false},
		"HRR, then more":     {append(bytes.Clone(hrr), 0x14, 3, 3, 0, 1, 1), true},
		"HRR in 2-byte bits": {hrr, true},
	} {
		for _, size := range []int{1, 2, 5, 1000} {
			var d hrrDetector
			decided, got := false, false
			for _, chunk := range chunked(tc.stream, size) {
				if decided, got = d.feed(chunk); decided {
					break
				}
			}
			if !decided || got != tc.hrr {
				t.Errorf("%s, %d-byte reads: decided %v, HRR %v; want HRR %v", name, size, decided, got, tc.hrr)
			}
		}
	}
	var d hrrDetector
	if decided, _ := d.feed(hrr[:20]); decided {
		t.Error("decided on 20 bytes")
	}
}

// recordConn records what is written to it.
type recordConn struct {
	net.Conn
	written []byte
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.written = append(c.written, p...)
	return len(p), nil
}

// Wrap, driven by scripted conns: the client's stream is its outer hello
// then after; the backend's stream is backend. The backend's stream is
// read first, so the client side knows whether it was a HelloRetryRequest
// when it meets the client's next handshake record.
func TestWrap(t *testing.T) {
	testwait.NoLeak(t, 0)
	h := getHeldKey(t)
	s := suite{kdfHKDFSHA256, aeadAES128GCM}
	outerExts := []ext{sniExt(publicName), versionsExt(tls.VersionTLS13)}
	encoded := func(name string) []byte {
		return encodeInner(nil, sniExt(name), innerECHExt(), outerExtsExt(extSupportedVersions))
	}
	innerMsg := func(name string) []byte {
		return helloWith(nil, sniExt(name), innerECHExt(), versionsExt(tls.VersionTLS13))
	}
	ccs := []byte{recordTypeChangeCipherSpec, 3, 3, 0, 1, 1}
	early := recordOf(23, []byte("early data"))
	serverHello := bytes.Clone(hrrBytes())
	serverHello[recordHeaderLen+handshakeHeaderLen+2] ^= 1 // not the HRR random
	alert := func(desc uint8) []byte { return []byte{recordTypeAlert, 3, 3, 0, 2, 2, desc} }

	for name, tc := range map[string]struct {
		outer   func(outerMsg []byte) []byte // the outer hello's records; nil: one record
		after   func(sl *sealer) []byte      // the client's bytes after its hello
		backend []byte
		want    func(res *ECHResult) []byte // what the backend receives; nil: an error
		err     error                       // the error of the client side, if want is nil
		alert   []byte                      // what is written to the client
	}{
		"no HRR": {
			after:   func(*sealer) []byte { return append(bytes.Clone(ccs), record([]byte("finished"))...) },
			backend: serverHello,
			want: func(res *ECHResult) []byte {
				return append(append(bytes.Clone(res.Records), ccs...), record([]byte("finished"))...)
			},
		},
		"no HRR, outer hello in 1-byte records": {
			outer:   func(m []byte) []byte { return reframe(m, 1) },
			after:   func(*sealer) []byte { return []byte("anything") },
			backend: serverHello,
			want:    func(res *ECHResult) []byte { return append(bytes.Clone(res.Records), "anything"...) },
		},
		"backend closes at once": {
			after:   func(*sealer) []byte { return record([]byte("x")) },
			backend: nil,
			want:    func(res *ECHResult) []byte { return append(bytes.Clone(res.Records), record([]byte("x"))...) },
		},
		"HRR": {
			after: func(sl *sealer) []byte {
				return append(append(bytes.Clone(early), ccs...), record(sl.seal(nil, encoded("retry.example.test"), outerExts...))...)
			},
			backend: hrrBytes(),
			want: func(res *ECHResult) []byte {
				return append(append(append(bytes.Clone(res.Records), early...), ccs...), record(innerMsg("retry.example.test"))...)
			},
		},
		"HRR, second hello in 7-byte records, then data": {
			after: func(sl *sealer) []byte {
				return append(reframe(sl.seal(nil, encoded(secretName), outerExts...), 7), "then data"...)
			},
			backend: reframe(hrrBytes()[recordHeaderLen:], 3),
			want: func(res *ECHResult) []byte {
				// Re-framed with the version of the client's records.
				return append(append(bytes.Clone(res.Records), record(innerMsg(secretName))...), "then data"...)
			},
		},
		"HRR, second hello for another key": {
			after: func(*sealer) []byte {
				other := newSealer(t, h.key, s)
				other.enc = nil
				return record(other.seal(nil, encoded(secretName), outerExts...))
			},
			backend: hrrBytes(),
			err:     ErrECHDecrypt,
			alert:   alert(alertDecryptError),
		},
		"HRR, second hello without ECH": {
			after:   func(*sealer) []byte { return record(helloWith(nil, outerExts...)) },
			backend: hrrBytes(),
			err:     ErrNoECH,
			alert:   alert(alertMissingExtension),
		},
		"HRR, second hello with an encapsulated key": {
			after: func(sl *sealer) []byte {
				sl.enc = []byte{1}
				return record(sl.seal(nil, encoded(secretName), outerExts...))
			},
			backend: hrrBytes(),
			err:     ErrMalformed,
			alert:   alert(alertIllegalParameter),
		},
		"HRR, not a hello": {
			after:   func(*sealer) []byte { return record([]byte{20, 0, 0, 1, 0}) },
			backend: hrrBytes(),
			err:     ErrMalformed,
			alert:   alert(alertIllegalParameter),
		},
		"HRR, second hello cut short": {
			after:   func(sl *sealer) []byte { return record(sl.seal(nil, encoded(secretName), outerExts...))[:50] },
			backend: hrrBytes(),
			err:     io.ErrUnexpectedEOF,
		},
		"HRR, second hello with bytes after it in its record": {
			after: func(sl *sealer) []byte {
				return record(append(sl.seal(nil, encoded(secretName), outerExts...), 1, 2, 3))
			},
			backend: hrrBytes(),
			err:     ErrMalformed,
			alert:   alert(alertIllegalParameter),
		},
		"not the outer hello": {
			outer:   func([]byte) []byte { return goHello(t) },
			backend: serverHello,
			err:     errNotOuter,
		},
		"bytes after the outer hello in its record": {
			outer:   func(m []byte) []byte { return record(append(bytes.Clone(m), 1, 2, 3)) },
			backend: serverHello,
			err:     ErrMalformed,
		},
		"outer hello cut short": {
			outer:   func(m []byte) []byte { return record(m)[:100] },
			backend: serverHello,
			err:     io.ErrUnexpectedEOF,
		},
	} {
		t.Run(name, func(t *testing.T) {
			sl := newSealer(t, h.key, s)
			outerMsg := sl.seal(nil, encoded(secretName), outerExts...)
			res, err := h.keys.Decrypt(parseMsg(t, outerMsg))
			if err != nil {
				t.Fatal(err)
			}
			stream := record(outerMsg)
			if tc.outer != nil {
				stream = tc.outer(outerMsg)
			}
			if tc.after != nil {
				stream = append(stream, tc.after(sl)...)
			}
			client := &recordConn{Conn: newScript(nil, io.EOF, stream)}
			c, b := res.Wrap(client, newScript(nil, io.EOF, tc.backend))
			defer c.Close()
			defer b.Close()
			if got, err := io.ReadAll(b); err != nil || !bytes.Equal(got, tc.backend) {
				t.Fatalf("the backend conn gave % x, %v; want its bytes", got, err)
			}
			got, err := io.ReadAll(c)
			if tc.want != nil {
				if want := tc.want(res); err != nil || !bytes.Equal(got, want) {
					t.Errorf("the backend received\n% x, %v; want\n% x", got, err, want)
				}
			} else if !errors.Is(err, tc.err) {
				t.Errorf("error %v, want %v", err, tc.err)
			}
			if !bytes.Equal(client.written, tc.alert) {
				t.Errorf("written to the client: % x, want % x", client.written, tc.alert)
			}
			if _, err2 := c.Read(make([]byte, 1)); tc.want == nil && err2 != err {
				t.Errorf("read after the error: %v, want the same error", err2)
			}
		})
	}
}

// A read of the client side waiting for the backend's first message ends
// when either conn is closed.
func TestWrapCloseUnblocks(t *testing.T) {
	testwait.NoLeak(t, 0)
	h := getHeldKey(t)
	msg := handshakeMsg(t, captureHello(t, echClient(t, h.list)))
	res, err := h.keys.Decrypt(parseMsg(t, msg))
	if err != nil {
		t.Fatal(err)
	}
	for _, closeBackend := range []bool{true, false} {
		// The client sends a handshake record at once; the backend is silent.
		backend, silent := net.Pipe()
		c, b := res.Wrap(newScript(nil, nil, record(msg), record([]byte("hs"))), backend)
		done := make(chan error, 1)
		go func() {
			_, err := io.ReadAll(c)
			done <- err
		}()
		if closeBackend {
			b.Close()
		} else {
			c.Close()
		}
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("closing the backend side %v: %v, want net.ErrClosed", closeBackend, err)
		}
		c.Close()
		b.Close()
		silent.Close()
	}
}

// The read deadline of the client side bounds a read waiting for the
// backend's first message; a later deadline lets the read go on, and a
// deadline changed during the wait applies at once.
func TestWrapDeadline(t *testing.T) {
	testwait.NoLeak(t, 0)
	h := getHeldKey(t)
	msg := handshakeMsg(t, captureHello(t, echClient(t, h.list)))
	res, err := h.keys.Decrypt(parseMsg(t, msg))
	if err != nil {
		t.Fatal(err)
	}
	backend, backendRemote := net.Pipe()
	defer backendRemote.Close()
	hs := record([]byte("hs"))
	c, b := res.Wrap(newScript(nil, nil, record(msg), hs), backend)
	defer c.Close()
	defer b.Close()

	buf := make([]byte, 64<<10)
	if n, err := c.Read(buf); err != nil || !bytes.Equal(buf[:n], res.Records) {
		t.Fatalf("first read: %d bytes, %v; want the inner hello", n, err)
	}
	// The client's handshake record waits for the backend.
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = c.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	// A deadline set during the wait applies.
	c.SetReadDeadline(time.Now().Add(time.Hour))
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("deadline shortened during the wait: %v, want a timeout", err)
	}
	// The backend answers with a ServerHello: the read goes on.
	serverHello := bytes.Clone(hrrBytes())
	serverHello[recordHeaderLen+handshakeHeaderLen+2] ^= 1
	go backendRemote.Write(serverHello)
	if _, err := io.ReadFull(b, make([]byte, len(serverHello))); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	if n, err := c.Read(buf); err != nil || !bytes.Equal(buf[:n], hs) {
		t.Fatalf("after the ServerHello: % x, %v; want % x", buf[:n], err, hs)
	}
}
