package sni

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/cryptobyte"
)

// ECH configurations and keys (RFC 9849, section 4).

// echConfigVersion is the version of the ECHConfig structure this package
// reads and writes; it is also the extension type of encrypted_client_hello.
const echConfigVersion = extECH

// The HPKE identifiers NewECHKey uses (RFC 9180, section 7).
const (
	kemX25519        uint16 = 0x0020 // DHKEM(X25519, HKDF-SHA256)
	kdfHKDFSHA256    uint16 = 0x0001
	aeadAES128GCM    uint16 = 0x0001
	aeadChaCha20     uint16 = 0x0003
	echMaxNameLength        = 64 // maximum_name_length of NewECHKey's configurations
)

// An echConfig is a parsed ECHConfig.
type echConfig struct {
	id         uint8
	kem        uint16
	publicKey  []byte
	suites     cryptobyte.String // (kdf_id, aead_id) pairs
	publicName string
}

// parseECHConfig parses one serialized ECHConfig, as in the Config field of
// a tls.EncryptedClientHelloKey: version 0xfe0d, and nothing after it.
func parseECHConfig(b []byte) (echConfig, error) {
	var c echConfig
	var version uint16
	var contents, publicName, extensions cryptobyte.String
	var maxNameLen uint8
	s := cryptobyte.String(b)
	if !s.ReadUint16(&version) || !s.ReadUint16LengthPrefixed(&contents) || !s.Empty() {
		return c, errors.New("malformed ECHConfig")
	}
	if version != echConfigVersion {
		return c, fmt.Errorf("ECHConfig version %#04x, want %#04x", version, echConfigVersion)
	}
	if !contents.ReadUint8(&c.id) || !contents.ReadUint16(&c.kem) ||
		!contents.ReadUint16LengthPrefixed((*cryptobyte.String)(&c.publicKey)) || len(c.publicKey) == 0 ||
		!contents.ReadUint16LengthPrefixed(&c.suites) || c.suites.Empty() || len(c.suites)%4 != 0 ||
		!contents.ReadUint8(&maxNameLen) ||
		!contents.ReadUint8LengthPrefixed(&publicName) || publicName.Empty() ||
		!contents.ReadUint16LengthPrefixed(&extensions) || !contents.Empty() {
		return c, errors.New("malformed ECHConfig")
	}
	c.publicName = string(publicName)
	return c, nil
}

// offers reports whether the configuration offers the cipher suite.
func (c *echConfig) offers(kdf, aead uint16) bool {
	for s := c.suites; !s.Empty(); {
		var k, a uint16
		s.ReadUint16(&k)
		s.ReadUint16(&a)
		if k == kdf && a == aead {
			return true
		}
	}
	return false
}

// An echKey is a key ready to decrypt.
type echKey struct {
	echConfig
	priv hpke.PrivateKey
	info []byte // "tls ech" || 0x00 || ECHConfig
}

// newECHKey checks and prepares a key whose configuration c is parsed.
func newECHKey(k tls.EncryptedClientHelloKey, c echConfig) (*echKey, error) {
	kem, err := hpke.NewKEM(c.kem)
	if err != nil {
		return nil, err
	}
	priv, err := kem.NewPrivateKey(k.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("private key: %v", err)
	}
	if !bytes.Equal(priv.PublicKey().Bytes(), c.publicKey) {
		return nil, errors.New("the private key does not match the configuration's public key")
	}
	info := append([]byte("tls ech\x00"), k.Config...)
	return &echKey{echConfig: c, priv: priv, info: info}, nil
}

// ECHKeys holds ECH keys ready to decrypt ClientHellos. Make one with
// NewECHKeys, once: it does the work that does not depend on the hello (for
// X25519, deriving the public key, a scalar multiplication), which
// DecryptECH repeats on every call. It is safe for concurrent use. A nil
// *ECHKeys holds no keys.
type ECHKeys struct {
	keys []*echKey
}

// NewECHKeys checks and prepares keys, in the form crypto/tls takes them
// (tls.Config.EncryptedClientHelloKeys): each Config is one serialized
// ECHConfig (version 0xfe0d), and each PrivateKey the private key of the
// configuration's HPKE KEM, in its serialization (for X25519, the 32-byte
// scalar). A configuration that does not parse, a KEM that crypto/hpke does
// not implement, or a private key that does not match the configuration's
// public key is an error. SendAsRetry is ignored. Several keys may share a
// config_id: Decrypt tries each.
func NewECHKeys(keys []tls.EncryptedClientHelloKey) (*ECHKeys, error) {
	ks := &ECHKeys{keys: make([]*echKey, 0, len(keys))}
	for i, k := range keys {
		c, err := parseECHConfig(k.Config)
		if err != nil {
			return nil, fmt.Errorf("sni: ECH key %d: %v", i, err)
		}
		key, err := newECHKey(k, c)
		if err != nil {
			return nil, fmt.Errorf("sni: ECH key %d (config_id %d): %v", i, c.id, err)
		}
		ks.keys = append(ks.keys, key)
	}
	return ks, nil
}

// Decrypt decrypts the ECH payload of outer, a hello as Parse or Peek
// returns it, and rebuilds the inner hello (RFC 9849, sections 5 and 7.1).
// It tries the keys whose configuration has the config_id of the outer
// extension and offers its cipher suite, in order.
//
// The errors, checked with errors.Is, say what to do with the connection:
//   - ErrNoECH: the hello has no encrypted_client_hello extension, or an
//     inner one. Route it by outer.ServerName, as without ECH.
//   - ErrECHNoKey, ErrECHDecrypt: ECH is rejected (GREASE ECH, a stale or
//     foreign configuration, a hello altered on the way). The hello is
//     served as the outer hello, for the public name outer.ServerName: a
//     client that really used ECH then expects the client-facing server to
//     complete the handshake for the public name and send it retry
//     configurations, which crypto/tls does when its
//     Config.EncryptedClientHelloKeys are marked SendAsRetry. A GREASE
//     client connects to the public name as it meant to.
//   - ErrMalformed, ErrInvalidName: the ECH extension is malformed, or
//     the payload decrypted into an invalid inner hello. The handshake must
//     be aborted (RFC 9849 wants an illegal_parameter or decode_error
//     alert).
func (k *ECHKeys) Decrypt(outer *ClientHello) (*ECHResult, error) {
	p, ext, err := outerECH(outer)
	if err != nil {
		return nil, err
	}
	var candidates []*echKey
	if k != nil {
		for _, key := range k.keys {
			if key.id == ext.ConfigID && key.offers(ext.KDF, ext.AEAD) {
				candidates = append(candidates, key)
			}
		}
	}
	return decrypt(outer, p, ext, candidates)
}

// DecryptECH decrypts the ECH payload of outer with keys, as
// ECHKeys.Decrypt does, with the same errors; it also returns an error if a
// key's configuration is malformed, and, for the keys it tries, as
// NewECHKeys does. A server that decrypts many hellos with the same keys
// should prepare them once with NewECHKeys instead, which saves some 40% of
// the cost of each hello (BenchmarkECH).
func DecryptECH(outer *ClientHello, keys []tls.EncryptedClientHelloKey) (*ECHResult, error) {
	p, ext, err := outerECH(outer)
	if err != nil {
		return nil, err
	}
	var candidates []*echKey
	for i, k := range keys {
		c, err := parseECHConfig(k.Config)
		if err != nil {
			return nil, fmt.Errorf("sni: ECH key %d: %v", i, err)
		}
		if c.id != ext.ConfigID || !c.offers(ext.KDF, ext.AEAD) {
			continue
		}
		key, err := newECHKey(k, c)
		if err != nil {
			return nil, fmt.Errorf("sni: ECH key %d (config_id %d): %v", i, c.id, err)
		}
		candidates = append(candidates, key)
	}
	return decrypt(outer, p, ext, candidates)
}

// outerECH splits outer and parses its outer ECH extension.
func outerECH(outer *ClientHello) (helloParts, *ECHExtension, error) {
	p, err := splitHello(outer)
	if err != nil {
		return p, nil, err
	}
	ext, err := p.ech()
	if err != nil {
		return p, nil, err
	}
	if ext.Type != ECHOuter {
		return p, nil, fmt.Errorf("%w: the hello carries an inner ECH extension, as a backend receives", ErrNoECH)
	}
	return p, ext, nil
}

// NewECHKey makes a new ECH key for a client-facing server whose public
// name is publicName: an X25519 key pair (HPKE KEM DHKEM(X25519,
// HKDF-SHA256)) and its ECHConfig (version 0xfe0d), which offers the cipher
// suites HKDF-SHA256 with AES-128-GCM and with ChaCha20Poly1305, a random
// config_id, a maximum_name_length of 64 (clients pad shorter names to hide
// their length) and no extensions. The key has SendAsRetry set, as a
// current key should: crypto/tls then offers it to clients whose
// configuration is stale.
//
// configList is the ECHConfigList with the key's configuration alone: what
// clients need (tls.Config.EncryptedClientHelloConfigList), and what the
// ech parameter of a DNS HTTPS record carries, in base64. To publish
// several keys at once, concatenate their Config fields after a 2-byte
// big-endian length of the whole.
//
// publicName must be a valid DNS host name of at least two labels, of
// letters, digits and hyphens, and not an IP address: clients ignore a
// configuration whose public name is not. It is stored lower-cased, without
// a trailing dot.
func NewECHKey(publicName string) (key tls.EncryptedClientHelloKey, configList []byte, err error) {
	name, err := echPublicName(publicName)
	if err != nil {
		return key, nil, err
	}
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return key, nil, fmt.Errorf("sni: generating an ECH key: %w", err)
	}
	var id [1]byte
	rand.Read(id[:]) // never fails

	b := cryptobyte.NewBuilder(nil)
	b.AddUint16(echConfigVersion)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint8(id[0])
		b.AddUint16(kemX25519)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(priv.PublicKey().Bytes()) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint16(kdfHKDFSHA256)
			b.AddUint16(aeadAES128GCM)
			b.AddUint16(kdfHKDFSHA256)
			b.AddUint16(aeadChaCha20)
		})
		b.AddUint8(echMaxNameLength)
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(name)) })
		b.AddUint16(0) // no extensions
	})
	config := b.BytesOrPanic() // a name of at most 253 bytes: no overflow
	l := cryptobyte.NewBuilder(make([]byte, 0, 2+len(config)))
	l.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(config) })
	key = tls.EncryptedClientHelloKey{Config: config, PrivateKey: priv.Bytes(), SendAsRetry: true}
	return key, l.BytesOrPanic(), nil
}

// echPublicName checks and normalises the public name of an ECH
// configuration. It takes the rules of ClientHello.ServerName, and those of
// crypto/tls's client, which ignores a configuration whose public name has
// one label, an underscore, or a hyphen at either end of a label.
func echPublicName(name string) (string, error) {
	n, _, err := checkHostName([]byte(name))
	if err != nil {
		return "", fmt.Errorf("sni: ECH public name: %w", err)
	}
	name = strings.ToLower(name[:n])
	if n == 0 || !strings.Contains(name, ".") {
		return "", fmt.Errorf("sni: ECH public name %q: %w: not a name of at least two labels", name, ErrInvalidName)
	}
	for label := range strings.SplitSeq(name, ".") {
		if strings.Contains(label, "_") || label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("sni: ECH public name %q: %w: an underscore, or a hyphen at the end of a label", name, ErrInvalidName)
		}
	}
	return name, nil
}
