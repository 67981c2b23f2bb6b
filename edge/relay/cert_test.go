package relay_test

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"slices"
	"testing"

	"github.com/tunnelkit/tunnelkit/edge/relay"
)

// ExamplePeerURI makes the template of an edge's relay certificate: its
// ID in a URI SAN, its address in an IP SAN, for serverAuth and clientAuth.
func ExamplePeerURI() {
	u, err := relay.PeerURI("10.0.0.2:7443")
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		URIs:        []*url.URL{u},
		IPAddresses: []net.IP{net.ParseIP("10.0.0.2")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	// ... x509.CreateCertificate(rand.Reader, tmpl, caCert, pub, caKey)
	fmt.Println(u)
	fmt.Println(relay.CertPeerIDs(tmpl))
	// Output:
	// tunnelkit-edge://10.0.0.2:7443
	// [10.0.0.2:7443]
}

// TestPeerURI: an ID that is a URI's authority makes a URI that names it
// and nothing else; any other ID is refused.
func TestPeerURI(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"edge-1", "10.0.0.2:7443", "[2001:db8::2]:7443", "edge-1.internal:7443"} {
		u, err := relay.PeerURI(id)
		if err != nil {
			t.Errorf("PeerURI(%q) = %v", id, err)
			continue
		}
		back, err := url.Parse(u.String())
		if err != nil {
			t.Fatal(err)
		}
		ids := relay.CertPeerIDs(&x509.Certificate{URIs: []*url.URL{back}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}})
		if !slices.Equal(ids, []string{id}) {
			t.Errorf("the certificate of PeerURI(%q) = %s names %q", id, u, ids)
		}
	}
	for _, id := range []string{"", "edge 1", "a/b", "user@edge", "edge?x", "edge#x"} {
		if u, err := relay.PeerURI(id); err == nil {
			t.Errorf("PeerURI(%q) = %s; want an error", id, u)
		}
	}
	// Other URIs name no edge.
	for _, s := range []string{"tunnelkit-edge:edge-1", "tunnelkit-edge://edge-1/path", "tunnelkit-edge://u@edge-1", "tunnelkit-edge://edge-1?q", "https://edge-1", "spiffe://edge-1"} {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		if ids := relay.CertPeerIDs(&x509.Certificate{URIs: []*url.URL{u}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); len(ids) > 0 {
			t.Errorf("a certificate with the URI %s names %q; want none", s, ids)
		}
	}
}
