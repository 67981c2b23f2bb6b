package relay

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
)

// PeerURIScheme is the scheme of the URI that names an edge in its relay
// certificate, a subject alternative name of type URI:
// "tunnelkit-edge://<ID>" (see PeerURI and CertPeerIDs).
const PeerURIScheme = "tunnelkit-edge"

// PeerURI returns the URI that names the edge id in a relay certificate,
// tunnelkit-edge://<id>, for x509.Certificate.URIs (OpenSSL:
// subjectAltName=URI:tunnelkit-edge://<id>). The ID is the URI's
// authority, so it must be one: a host name or an IP address, with a port
// or not ("edge-1", "10.0.0.2:7443", "[2001:db8::2]:7443"); PeerURI fails
// for any other.
func PeerURI(id string) (*url.URL, error) {
	u := &url.URL{Scheme: PeerURIScheme, Host: id}
	if back, err := url.Parse(u.String()); err != nil || id == "" || back.Host != id || !isPeerURI(back) {
		return nil, fmt.Errorf("relay: edge ID %q cannot be the authority of a %s:// URI", id, PeerURIScheme)
	}
	return u, nil
}

// CertPeerIDs is the default Relay.PeerIDs: the IDs that cert names in
// subject alternative names of type URI of the form
// tunnelkit-edge://<ID>, if its extended key usages name both serverAuth
// and clientAuth (an edge's relay certificate serves both ways); none
// otherwise. So a certificate without extended key usages (which
// crypto/x509 accepts for any use), one for anyExtendedKeyUsage, and one
// the CA issued to another service (without such a URI) name no edge,
// whatever else they say. IDs are compared exactly, without case folding.
func CertPeerIDs(cert *x509.Certificate) []string {
	if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return nil
	}
	var ids []string
	for _, u := range cert.URIs {
		if isPeerURI(u) {
			ids = append(ids, u.Host)
		}
	}
	return ids
}

// isPeerURI reports whether u is tunnelkit-edge://<ID> and nothing more.
func isPeerURI(u *url.URL) bool {
	return u.Scheme == PeerURIScheme && u.Host != "" && u.User == nil && u.Opaque == "" &&
		u.Path == "" && u.RawQuery == "" && !u.ForceQuery && u.Fragment == ""
}

// errNotAnEdge refuses a relay peer whose certificate names no edge.
var errNotAnEdge = errors.New("relay: the peer's certificate names no edge (want a tunnelkit-edge://<ID> URI SAN and the serverAuth and clientAuth extended key usages)")
