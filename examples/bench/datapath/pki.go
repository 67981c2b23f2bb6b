//go:build unix

package main

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"path/filepath"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchpki"
)

// Names of the PEM files in a run's directory.
const (
	caFileName   = "ca.pem"
	certFileName = "cert.pem"
	keyFileName  = "key.pem"
)

// certNames are the names the run's one certificate covers: every public
// name under the edge's domain, and the loopback address that TLS agent
// links and the baseline proxies are reached on.
var certNames = []string{"*." + domain, "127.0.0.1"}

// writePKI makes a throwaway CA and one server certificate signed by it,
// valid for a day, and writes them to dir as ca.pem, cert.pem and
// key.pem. Every TLS server of the run (the edge's https endpoints and
// agent port, the baseline proxies) uses that certificate; every client
// trusts ca.pem.
func writePKI(dir string) error {
	ca, err := benchpki.New("datapath benchmark CA", 24*time.Hour)
	if err != nil {
		return err
	}
	if err := ca.WriteCert(filepath.Join(dir, caFileName)); err != nil {
		return err
	}
	tmpl := x509.Certificate{
		Subject:     pkix.Name{CommonName: certNames[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range certNames {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	return ca.Issue(tmpl, filepath.Join(dir, certFileName), filepath.Join(dir, keyFileName))
}

// loadCert returns the certificate of dir's cert.pem and key.pem.
func loadCert(dir string) (tls.Certificate, error) {
	return tls.LoadX509KeyPair(filepath.Join(dir, certFileName), filepath.Join(dir, keyFileName))
}

// newServerTLS returns the configuration of a TLS server with cert.
func newServerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}
