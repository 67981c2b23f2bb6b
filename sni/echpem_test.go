package sni_test

import (
	"bytes"
	"encoding/pem"
	"testing"

	"github.com/tunnelkit/tunnelkit/sni"
)

func TestECHKeyPEMRoundTrip(t *testing.T) {
	key, list, err := sni.NewECHKey("ech.example.test")
	if err != nil {
		t.Fatal(err)
	}
	file, err := sni.MarshalECHKeyPEM(key, list)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for rest := file; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		types = append(types, b.Type)
	}
	if len(types) != 2 || types[0] != "PRIVATE KEY" || types[1] != "ECHCONFIG" {
		t.Fatalf("PEM blocks %v, want PRIVATE KEY and ECHCONFIG", types)
	}
	got, gotList, err := sni.ParseECHKeyPEM(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Config, key.Config) || !bytes.Equal(got.PrivateKey, key.PrivateKey) || !got.SendAsRetry || !bytes.Equal(gotList, list) {
		t.Fatal("the key read back differs")
	}

	// Another key's config with this private key: refused.
	_, otherList, _ := sni.NewECHKey("ech.example.test")
	if _, err := sni.MarshalECHKeyPEM(key, otherList); err == nil {
		t.Error("a key marshalled with another key's config list")
	}
	mixed := append(bytes.Clone(file[:bytes.Index(file, []byte("-----BEGIN ECHCONFIG"))]), pem.EncodeToMemory(&pem.Block{Type: "ECHCONFIG", Bytes: otherList})...)
	if _, _, err := sni.ParseECHKeyPEM(mixed); err == nil {
		t.Error("a file whose config is for another key accepted")
	}
	for _, bad := range [][]byte{nil, []byte("junk"), file[:40]} {
		if _, _, err := sni.ParseECHKeyPEM(bad); err == nil {
			t.Errorf("ParseECHKeyPEM(%q) accepted", bad)
		}
	}
}

// FuzzParseECHKeyPEM: no input makes ParseECHKeyPEM panic.
func FuzzParseECHKeyPEM(f *testing.F) {
	key, list, _ := sni.NewECHKey("ech.example.test")
	file, _ := sni.MarshalECHKeyPEM(key, list)
	f.Add(file)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "ECHCONFIG", Bytes: []byte{0, 4, 0xfe, 0x0d, 0, 0}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		sni.ParseECHKeyPEM(data)
	})
}

func TestECHPublicName(t *testing.T) {
	key, _, err := sni.NewECHKey("ECH.Example.test")
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := sni.ECHPublicName(key.Config); !ok || name != "ech.example.test" {
		t.Fatalf("ECHPublicName = %q, %v", name, ok)
	}
	for i := range key.Config {
		sni.ECHPublicName(key.Config[:i]) // no panic on a cut config
	}
}
