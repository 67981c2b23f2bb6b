//go:build unix

package main

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchpki"
)

// pki is the run's throwaway CA, which signs the edges' certificates:
// each edge's agent port and relay port use one of its own, which names
// the edge's relay ID (URI SAN tunnelkit-edge://ID) and 127.0.0.1.
type pki struct {
	dir string
	ca  *benchpki.CA
}

// caFile is the name of the CA's PEM file in the run's directory.
const caFile = "ca.pem"

func newPKI(dir string) (*pki, error) {
	ca, err := benchpki.New("scale benchmark CA", 48*time.Hour)
	if err != nil {
		return nil, err
	}
	return &pki{dir: dir, ca: ca}, ca.WriteCert(filepath.Join(dir, caFile))
}

// issueEdge writes the certificate of the edge whose relay ID is id, and
// its key, as NAME.pem and NAME-key.pem, and returns their paths.
func (p *pki) issueEdge(name, id string) (cert, key string, err error) {
	cert, key = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	return cert, key, p.ca.Issue(x509.Certificate{
		Subject:     pkix.Name{CommonName: id},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs:        []*url.URL{{Scheme: "tunnelkit-edge", Host: id}},
	}, cert, key)
}
