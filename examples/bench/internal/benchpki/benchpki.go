// Package benchpki is the throwaway certificate authority of the benchmark
// programs (examples/bench/datapath and examples/bench/scale): a CA made
// for one run, the certificates it signs written as PEM files, and a pool
// of its root for the clients.
package benchpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"time"
)

// CA signs the certificates of one run, each valid from an hour before it
// was made for as long as the CA's validity.
type CA struct {
	cert   *x509.Certificate
	der    []byte
	key    *ecdsa.PrivateKey
	valid  time.Duration
	serial int64
}

// New makes a CA named name (its CommonName) valid for valid.
func New(name string, valid time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(valid),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, der: der, key: key, valid: valid, serial: 1}, nil
}

// WriteCert writes the CA's certificate to path, as PEM.
func (ca *CA) WriteCert(path string) error { return writePEM(path, "CERTIFICATE", ca.der) }

// Issue signs a certificate of tmpl (its names, usages and subject; the
// serial number, validity and key are the CA's to set) for a new P-256
// key, and writes both, as PEM, to certPath and keyPath.
func (ca *CA) Issue(tmpl x509.Certificate, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	ca.serial++
	now := time.Now()
	tmpl.SerialNumber = big.NewInt(ca.serial)
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(ca.valid)
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyPath, "PRIVATE KEY", keyDER)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// LoadRoots returns a pool holding the certificates of the PEM file at
// path.
func LoadRoots(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}
