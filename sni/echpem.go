package sni

import (
	"crypto/ecdh"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"golang.org/x/crypto/cryptobyte"
)

// ECH key files, in the layout OpenSSL's and nginx's ECH support read
// (draft-farrell-tls-pemesni): a "PRIVATE KEY" block holding the X25519
// private key in PKCS #8, then an "ECHCONFIG" block holding the
// ECHConfigList with that key's configuration.

// MarshalECHKeyPEM returns key (an X25519 key, as NewECHKey makes) and its
// ECHConfigList as a PEM key file.
func MarshalECHKeyPEM(key tls.EncryptedClientHelloKey, configList []byte) ([]byte, error) {
	priv, err := ecdh.X25519().NewPrivateKey(key.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("sni: ECH key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sni: ECH key: %w", err)
	}
	configs, err := splitECHConfigList(configList)
	if err != nil {
		return nil, err
	}
	found := false
	for _, c := range configs {
		found = found || string(c) == string(key.Config)
	}
	if !found {
		return nil, errors.New("sni: ECH key: its config is not in the ECHConfigList")
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "ECHCONFIG", Bytes: configList})...), nil
}

// ParseECHKeyPEM reads a PEM key file: its private key and the
// configuration of its ECHConfigList that goes with that key. The key is
// marked SendAsRetry. It also returns the ECHConfigList, to publish.
func ParseECHKeyPEM(data []byte) (key tls.EncryptedClientHelloKey, configList []byte, err error) {
	var priv *ecdh.PrivateKey
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return key, nil, fmt.Errorf("sni: ECH key file: %w", err)
			}
			p, ok := k.(*ecdh.PrivateKey)
			if !ok || p.Curve() != ecdh.X25519() {
				return key, nil, errors.New("sni: ECH key file: the private key is not X25519")
			}
			priv = p
		case "ECHCONFIG":
			configList = b.Bytes
		}
	}
	if priv == nil || configList == nil {
		return key, nil, errors.New("sni: ECH key file: want a PRIVATE KEY block and an ECHCONFIG block")
	}
	configs, err := splitECHConfigList(configList)
	if err != nil {
		return key, nil, err
	}
	pub := priv.PublicKey().Bytes()
	for _, c := range configs {
		if parsed, err := parseECHConfig(c); err == nil && string(parsed.publicKey) == string(pub) {
			return tls.EncryptedClientHelloKey{Config: c, PrivateKey: priv.Bytes(), SendAsRetry: true}, configList, nil
		}
	}
	return key, nil, errors.New("sni: ECH key file: no configuration in its ECHCONFIG block is for its private key")
}

// splitECHConfigList returns the ECHConfigs of an ECHConfigList, each
// whole (version, length, contents).
func splitECHConfigList(list []byte) ([][]byte, error) {
	s := cryptobyte.String(list)
	var configs cryptobyte.String
	if !s.ReadUint16LengthPrefixed(&configs) || !s.Empty() || configs.Empty() {
		return nil, errors.New("sni: malformed ECHConfigList")
	}
	var out [][]byte
	for !configs.Empty() {
		start := configs
		var version uint16
		var body cryptobyte.String
		if !configs.ReadUint16(&version) || !configs.ReadUint16LengthPrefixed(&body) {
			return nil, errors.New("sni: malformed ECHConfigList")
		}
		out = append(out, start[:len(start)-len(configs)])
	}
	return out, nil
}

// ECHPublicName returns the public name of an ECHConfig (a
// tls.EncryptedClientHelloKey's Config): the name clients put in the outer
// hello, to which a client-facing server answers when it cannot decrypt.
func ECHPublicName(config []byte) (string, bool) {
	c, err := parseECHConfig(config)
	if err != nil {
		return "", false
	}
	return c.publicName, true
}
