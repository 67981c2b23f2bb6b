package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"
)

// IssueTemplate returns a certificate the CA signs from tmpl, with a key
// of its own: what tmpl says (its names, key usages, extended key usages:
// none if it has none), and, where tmpl leaves them zero, a fresh serial
// number and a validity of a day.
func (ca *CA) IssueTemplate(t testing.TB, tmpl x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber == nil {
		tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// IssueEdge returns the relay certificate of the edges ids of a cluster:
// a URI SAN tunnelkit-edge://<ID> for each, the DNS names or IP
// addresses hosts, and the serverAuth and clientAuth extended key usages.
func (ca *CA) IssueEdge(t testing.TB, ids []string, hosts ...string) tls.Certificate {
	t.Helper()
	tmpl := x509.Certificate{
		Subject:     pkix.Name{CommonName: "edge"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if len(ids) > 0 {
		tmpl.Subject.CommonName = ids[0]
	}
	for _, id := range ids {
		tmpl.URIs = append(tmpl.URIs, &url.URL{Scheme: "tunnelkit-edge", Host: id})
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.IssueTemplate(t, tmpl)
}
