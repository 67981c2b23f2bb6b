package names

import (
	"crypto/tls"
	"crypto/x509"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Certified reads what the operator's certificates cover, to warn of a
// certificate for another domain: every DNS name they carry, whether one
// is domain (normalised) or under it, and which of public (the public
// names of the ECH keys) none covers.
func Certified(certs []tls.Certificate, domain string, public []string) (all []string, underDomain bool, uncovered []string) {
	covered := map[string]bool{}
	for _, c := range certs {
		leaf := c.Leaf
		if leaf == nil && len(c.Certificate) > 0 {
			leaf, _ = x509.ParseCertificate(c.Certificate[0])
		}
		if leaf == nil {
			continue
		}
		for _, n := range leaf.DNSNames {
			all = append(all, n)
			n = strings.ToLower(n)
			underDomain = underDomain || domain != "" && (n == domain || strings.HasSuffix(n, "."+domain))
		}
		for _, p := range public {
			covered[p] = covered[p] || leaf.VerifyHostname(p) == nil
		}
	}
	for _, p := range public {
		if !covered[p] {
			uncovered = append(uncovered, p)
		}
	}
	return all, underDomain, uncovered
}

// AnswersFor reports whether a connection for host may go to r: for tcp,
// one without a host; otherwise, one whose host (an HTTP Host, with a
// port or not, or a TLS server name) r's name or wildcard covers.
func AnswersFor(r router.Route, host string) bool {
	if r.Proto == wire.ProtoTCP {
		return host == ""
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && r.Proto != wire.ProtoTLS {
		host = host[:i] // a port: an IPv6 literal would not be a name anyway
	}
	host, ok := router.Normalise(host)
	if !ok {
		return false
	}
	name, ok := router.NormalisePattern(r.Name)
	if !ok {
		return false
	}
	if base, wild := strings.CutPrefix(name, "*."); wild {
		return strings.HasSuffix(host, "."+base)
	}
	return host == name
}
