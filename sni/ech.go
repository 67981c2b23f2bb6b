package sni

import (
	"crypto/hpke"
	"crypto/tls"
	"errors"
	"fmt"

	"golang.org/x/crypto/cryptobyte"
)

// Encrypted ClientHello (ECH, RFC 9849) in split mode: the client-facing
// server, which holds the ECH keys, decrypts the outer ClientHello's ECH
// payload and hands the inner ClientHello to a backend server, which
// completes the handshake without any ECH key. Go's crypto/tls server (Go
// 1.24 and later) is such a backend: given a ClientHello that carries the
// inner ECH extension, it completes the handshake and signals to the client
// that ECH was accepted.

// extECHOuterExtensions is the ech_outer_extensions extension (RFC 9849,
// section 5.1), which an EncodedClientHelloInner uses to refer to
// extensions of the outer hello instead of repeating them.
const extECHOuterExtensions uint16 = 0xfd00

// ECHType is the type of an encrypted_client_hello extension.
type ECHType uint8

// The two types of encrypted_client_hello extension (RFC 9849, section 5).
const (
	// ECHOuter is the extension of the hello a client sends: it carries
	// the encrypted inner hello, or random bytes (GREASE ECH).
	ECHOuter ECHType = 0
	// ECHInner is the extension of the inner hello, the hello a
	// split-mode backend receives. It has no content.
	ECHInner ECHType = 1
)

// An ECHExtension is the content of an encrypted_client_hello extension
// (RFC 9849, section 5). The fields other than Type are set for an outer
// extension only.
type ECHExtension struct {
	Type ECHType

	// KDF and AEAD are the HPKE cipher suite the client chose among those
	// of the ECH configuration: 0x0001 is HKDF-SHA256; 0x0001 AES-128-GCM,
	// 0x0002 AES-256-GCM, 0x0003 ChaCha20Poly1305.
	KDF, AEAD uint16

	// ConfigID identifies the ECH configuration, and so the key, the
	// client encrypted to. GREASE ECH has a random one.
	ConfigID uint8

	// Enc is the HPKE encapsulated key. It is empty in the second
	// ClientHello after a HelloRetryRequest, which reuses the HPKE context
	// of the first.
	Enc []byte

	// Payload is the encrypted EncodedClientHelloInner.
	Payload []byte
}

// ECHExtension parses the hello's encrypted_client_hello extension. It
// returns ErrNoECH if the hello has none, and an error wrapping ErrMalformed
// if the extension is malformed or of an unknown type (a TLS server aborts
// the handshake on such a hello). Enc and Payload share memory with h.Raw.
func (h *ClientHello) ECHExtension() (*ECHExtension, error) {
	p, err := splitHello(h)
	if err != nil {
		return nil, err
	}
	return p.ech()
}

// helloParts are the fields of a ClientHello message, as slices of it.
type helloParts struct {
	versionRandom cryptobyte.String // legacy_version and random
	sessionID     cryptobyte.String
	suites        cryptobyte.String // cipher_suites
	compressions  cryptobyte.String
	extensions    cryptobyte.String // the extensions, without their length
}

// splitHello splits the ClientHello message h.Raw into its fields. A hello
// without an extensions block has an empty extensions field.
func splitHello(h *ClientHello) (helloParts, error) {
	var p helloParts
	if h == nil {
		return p, fmt.Errorf("%w: nil ClientHello", ErrMalformed)
	}
	var msgType uint8
	var body cryptobyte.String
	s := cryptobyte.String(h.Raw)
	if !s.ReadUint8(&msgType) || msgType != typeClientHello ||
		!s.ReadUint24LengthPrefixed(&body) || !s.Empty() {
		return p, fmt.Errorf("%w: bad handshake header", ErrMalformed)
	}
	if !body.ReadBytes((*[]byte)(&p.versionRandom), 2+32) ||
		!body.ReadUint8LengthPrefixed(&p.sessionID) ||
		!body.ReadUint16LengthPrefixed(&p.suites) ||
		!body.ReadUint8LengthPrefixed(&p.compressions) {
		return p, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	if !body.Empty() && (!body.ReadUint16LengthPrefixed(&p.extensions) || !body.Empty()) {
		return p, fmt.Errorf("%w: bad extensions block", ErrMalformed)
	}
	for exts := p.extensions; !exts.Empty(); {
		var typ uint16
		var data cryptobyte.String
		if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) {
			return p, fmt.Errorf("%w: truncated extension", ErrMalformed)
		}
	}
	return p, nil
}

// next reads the next extension of exts, a list that splitHello checked.
func next(exts *cryptobyte.String) (typ uint16, data cryptobyte.String) {
	if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) {
		*exts = nil // cannot happen after splitHello; ends the loop if it did
	}
	return typ, data
}

// ech finds and parses the encrypted_client_hello extension.
func (p helloParts) ech() (*ECHExtension, error) {
	for exts := p.extensions; !exts.Empty(); {
		if typ, data := next(&exts); typ == extECH {
			return parseECHExtension(data)
		}
	}
	return nil, ErrNoECH
}

// parseECHExtension parses the content of an encrypted_client_hello
// extension.
func parseECHExtension(data cryptobyte.String) (*ECHExtension, error) {
	var e ECHExtension
	var typ uint8
	if !data.ReadUint8(&typ) {
		return nil, fmt.Errorf("%w: empty encrypted_client_hello extension", ErrMalformed)
	}
	e.Type = ECHType(typ)
	switch e.Type {
	case ECHInner:
		if !data.Empty() {
			return nil, fmt.Errorf("%w: inner encrypted_client_hello extension with content", ErrMalformed)
		}
		return &e, nil
	case ECHOuter:
		if !data.ReadUint16(&e.KDF) || !data.ReadUint16(&e.AEAD) ||
			!data.ReadUint8(&e.ConfigID) ||
			!data.ReadUint16LengthPrefixed((*cryptobyte.String)(&e.Enc)) ||
			!data.ReadUint16LengthPrefixed((*cryptobyte.String)(&e.Payload)) ||
			len(e.Payload) == 0 || !data.Empty() {
			return nil, fmt.Errorf("%w: bad outer encrypted_client_hello extension", ErrMalformed)
		}
		return &e, nil
	}
	return nil, fmt.Errorf("%w: encrypted_client_hello extension of unknown type %d", ErrMalformed, typ)
}

// An ECHResult is a decrypted ClientHello: what a client-facing server
// needs to route a connection by the name the client wants, and to hand the
// hello to the backend that completes the handshake.
type ECHResult struct {
	// Outer is the hello the client sent, as given to Decrypt:
	// Outer.ServerName is the public name of the ECH configuration.
	Outer *ClientHello

	// Inner is the ClientHelloInner, the hello the client encrypted, as
	// it wrote it: Inner.ServerName is the name the client wants to reach,
	// Inner.ALPN its protocols, and Inner.Raw the message (type, length,
	// body), which carries the inner encrypted_client_hello extension.
	Inner *ClientHello

	// Records is Inner.Raw framed as TLS handshake records of at most
	// 2^14 bytes, with the record version of the outer hello's first
	// record: the bytes to send to the backend in place of the records of
	// the outer hello. The client's bytes that follow the outer hello go
	// to the backend untouched, unless the backend answers with a
	// HelloRetryRequest: see DecryptRetry and Wrap.
	Records []byte

	configID  uint8
	kdf, aead uint16
	// hpke is the HPKE context, for the second hello of a
	// HelloRetryRequest; nil once used, and in the result of DecryptRetry.
	hpke *hpke.Recipient
}

// DecryptRetry decrypts the second ClientHello a client sends, after the
// backend answered the first with a HelloRetryRequest, with the HPKE
// context of the first (RFC 9849, section 7.1.1). second is the hello as
// Parse or Peek returns it. Wrap calls DecryptRetry itself.
//
// Any error means the connection must be aborted: ErrNoECH (the second
// hello has no outer ECH extension), ErrMalformed (its extension changed
// the configuration or cipher suite or carries an encapsulated key, or its
// inner hello is invalid), ErrInvalidName, ErrECHDecrypt. DecryptRetry can
// be called once, and not on its own result; it is not safe for concurrent
// use.
func (r *ECHResult) DecryptRetry(second *ClientHello) (*ECHResult, error) {
	ctx := r.hpke
	if ctx == nil {
		return nil, fmt.Errorf("%w: the HPKE context of this ECHResult is used up (DecryptRetry is called once, on the result of Decrypt)", ErrECHDecrypt)
	}
	r.hpke = nil
	p, err := splitHello(second)
	if err != nil {
		return nil, err
	}
	ext, err := p.ech()
	if err != nil {
		return nil, err
	}
	if ext.Type != ECHOuter {
		return nil, fmt.Errorf("%w: the second ClientHello has an inner ECH extension", ErrNoECH)
	}
	if ext.ConfigID != r.configID || ext.KDF != r.kdf || ext.AEAD != r.aead || len(ext.Enc) != 0 {
		return nil, fmt.Errorf("%w: the second ClientHello's ECH extension changed its configuration or cipher suite, or has an encapsulated key", ErrMalformed)
	}
	encoded, err := ctx.Open(p.aad(ext), ext.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: second ClientHello: %v", ErrECHDecrypt, err)
	}
	res, err := newECHResult(second, p, encoded)
	if err != nil {
		return nil, err
	}
	res.configID, res.kdf, res.aead = r.configID, r.kdf, r.aead
	return res, nil
}

// decrypt tries the candidate keys, those with the extension's config_id
// and cipher suite, in order.
func decrypt(outer *ClientHello, p helloParts, ext *ECHExtension, candidates []*echKey) (*ECHResult, error) {
	if len(candidates) == 0 {
		return nil, fmt.Errorf("%w: config_id %d, cipher suite %#04x/%#04x", ErrECHNoKey, ext.ConfigID, ext.KDF, ext.AEAD)
	}
	kdf, err := hpke.NewKDF(ext.KDF)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrECHNoKey, err)
	}
	aead, err := hpke.NewAEAD(ext.AEAD)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrECHNoKey, err)
	}
	aad := p.aad(ext)
	err = nil
	for _, k := range candidates {
		var ctx *hpke.Recipient
		ctx, err = hpke.NewRecipient(ext.Enc, k.priv, kdf, aead, k.info)
		if err != nil {
			continue
		}
		var encoded []byte
		encoded, err = ctx.Open(aad, ext.Payload)
		if err != nil {
			continue
		}
		// Decrypted: from here on, an error aborts the handshake
		// (RFC 9849, section 7.1), whatever the other keys would say.
		res, err := newECHResult(outer, p, encoded)
		if err != nil {
			return nil, err
		}
		res.configID, res.kdf, res.aead = ext.ConfigID, ext.KDF, ext.AEAD
		res.hpke = ctx
		return res, nil
	}
	return nil, fmt.Errorf("%w: config_id %d: %v", ErrECHDecrypt, ext.ConfigID, err)
}

// aad returns ClientHelloOuterAAD (RFC 9849, section 5.2): the
// ClientHelloOuter without its handshake header, the payload of its ECH
// extension replaced by as many zeros. Rebuilding the message with the
// builder, rather than zeroing bytes at an offset, keeps the lengths
// checked.
func (p helloParts) aad(ext *ECHExtension) []byte {
	b := cryptobyte.NewBuilder(make([]byte, 0, 2+32+1+len(p.sessionID)+2+len(p.suites)+1+len(p.compressions)+2+len(p.extensions)))
	b.AddBytes(p.versionRandom)
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(p.sessionID) })
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(p.suites) })
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(p.compressions) })
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		for exts := p.extensions; !exts.Empty(); {
			typ, data := next(&exts)
			b.AddUint16(typ)
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
				if typ != extECH {
					b.AddBytes(data)
					return
				}
				b.AddUint8(uint8(ECHOuter))
				b.AddUint16(ext.KDF)
				b.AddUint16(ext.AEAD)
				b.AddUint8(ext.ConfigID)
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(ext.Enc) })
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(make([]byte, len(ext.Payload))) })
			})
		}
	})
	return b.BytesOrPanic() // lengths as in the parsed hello: cannot overflow
}

// newECHResult rebuilds the inner hello from the decrypted
// EncodedClientHelloInner of outer, parses it, and frames it in records.
func newECHResult(outer *ClientHello, p helloParts, encoded []byte) (*ECHResult, error) {
	msg, err := decodeInner(p, encoded)
	if err != nil {
		return nil, err
	}
	inner, err := parseHello(msg)
	if err != nil {
		return nil, fmt.Errorf("%w (in the inner ClientHello)", err)
	}
	inner.RecordVersion = outer.RecordVersion
	if inner.RecordVersion == 0 {
		inner.RecordVersion = tls.VersionTLS10 // as clients send their first record
	}
	// RFC 9849, section 7.1: the inner hello must carry an inner ECH
	// extension and offer TLS 1.3, and nothing older.
	if e, err := inner.ECHExtension(); err != nil || e.Type != ECHInner {
		return nil, fmt.Errorf("%w: the inner ClientHello has no inner encrypted_client_hello extension", ErrMalformed)
	}
	tls13 := false
	for _, v := range inner.SupportedVersions {
		if v < tls.VersionTLS13 {
			return nil, fmt.Errorf("%w: the inner ClientHello offers TLS version %#04x", ErrMalformed, v)
		}
		tls13 = tls13 || v == tls.VersionTLS13
	}
	if !tls13 {
		return nil, fmt.Errorf("%w: the inner ClientHello does not offer TLS 1.3", ErrMalformed)
	}
	return &ECHResult{
		Outer:   outer,
		Inner:   inner,
		Records: frameRecords(msg, inner.RecordVersion),
	}, nil
}

// decodeInner turns an EncodedClientHelloInner into the ClientHelloInner
// message (RFC 9849, section 5.1): it checks that the padding is zeros,
// copies legacy_session_id from the outer hello, and replaces each
// ech_outer_extensions extension by the outer extensions it names. Those
// must appear in the outer hello in the order named, each at most once, and
// not include encrypted_client_hello: one forward pass over the outer
// extensions checks it all, in linear time (RFC 9849, appendix A), and
// bounds the inner hello by the sizes of the two others.
func decodeInner(outer helloParts, encoded []byte) ([]byte, error) {
	var versionRandom, sessionID, suites, compressions, exts cryptobyte.String
	s := cryptobyte.String(encoded)
	if !s.ReadBytes((*[]byte)(&versionRandom), 2+32) ||
		!s.ReadUint8LengthPrefixed(&sessionID) ||
		!s.ReadUint16LengthPrefixed(&suites) ||
		!s.ReadUint8LengthPrefixed(&compressions) ||
		!s.ReadUint16LengthPrefixed(&exts) {
		return nil, fmt.Errorf("%w: truncated EncodedClientHelloInner", ErrMalformed)
	}
	if !sessionID.Empty() {
		return nil, fmt.Errorf("%w: EncodedClientHelloInner with a legacy_session_id", ErrMalformed)
	}
	for _, c := range s {
		if c != 0 {
			return nil, fmt.Errorf("%w: EncodedClientHelloInner padding is not zeros", ErrMalformed)
		}
	}

	outerExts := outer.extensions // read forward, once
	b := cryptobyte.NewBuilder(make([]byte, 0, 4+len(encoded)+len(outer.sessionID)+len(outer.extensions)))
	b.AddUint8(typeClientHello)
	b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddBytes(versionRandom)
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(outer.sessionID) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(suites) })
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(compressions) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			for !exts.Empty() {
				var typ uint16
				var data cryptobyte.String
				if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) {
					b.SetError(fmt.Errorf("%w: truncated extension in EncodedClientHelloInner", ErrMalformed))
					return
				}
				if typ != extECHOuterExtensions {
					b.AddUint16(typ)
					b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(data) })
					continue
				}
				var list cryptobyte.String
				if !data.ReadUint8LengthPrefixed(&list) || list.Empty() || len(list)%2 != 0 || !data.Empty() {
					b.SetError(fmt.Errorf("%w: bad ech_outer_extensions extension", ErrMalformed))
					return
				}
				for !list.Empty() {
					var want uint16
					list.ReadUint16(&want)
					if want == extECH {
						b.SetError(fmt.Errorf("%w: ech_outer_extensions names encrypted_client_hello", ErrMalformed))
						return
					}
					for {
						if outerExts.Empty() {
							b.SetError(fmt.Errorf("%w: ech_outer_extensions names extension %#04x, which the outer ClientHello lacks (or has earlier than another one named, or once for two names)", ErrMalformed, want))
							return
						}
						if otyp, odata := next(&outerExts); otyp == want {
							b.AddUint16(otyp)
							b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(odata) })
							break
						}
					}
				}
			}
		})
	})
	msg, err := b.Bytes()
	if err != nil && !errors.Is(err, ErrMalformed) {
		err = fmt.Errorf("%w: inner ClientHello: %v", ErrMalformed, err) // a length overflow
	}
	return msg, err
}

// frameRecords frames a handshake message in TLS handshake records of at
// most 2^14 bytes.
func frameRecords(msg []byte, version uint16) []byte {
	n := (len(msg) + maxRecordLen - 1) / maxRecordLen
	b := cryptobyte.NewBuilder(make([]byte, 0, n*recordHeaderLen+len(msg)))
	for len(msg) > 0 {
		chunk := msg[:min(len(msg), maxRecordLen)]
		msg = msg[len(chunk):]
		b.AddUint8(recordTypeHandshake)
		b.AddUint16(version)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(chunk) })
	}
	return b.BytesOrPanic() // chunks of at most 2^14 bytes
}
