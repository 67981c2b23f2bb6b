package policy

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
)

// mutualTLS is a compiled mutual_tls kind: the pool the edge asks client
// certificates of, and the fingerprints of its CAs, to tell which pool a
// connection's verified chains end in.
type mutualTLS struct {
	pool  *x509.CertPool
	roots map[[sha256.Size]byte]bool
}

func newMutualTLS(m *MutualTLS) (*mutualTLS, error) {
	cas, err := parseCAs(m.CAs)
	if err != nil {
		return nil, err
	}
	t := &mutualTLS{pool: x509.NewCertPool(), roots: map[[sha256.Size]byte]bool{}}
	for _, c := range cas {
		t.pool.AddCert(c)
		t.roots[sha256.Sum256(c.Raw)] = true
	}
	return t, nil
}

// verify returns the subject of the client certificate of cs if one of its
// verified chains ends in one of the policy's CAs. Checking the chain's
// root, not only that there is one, keeps a connection whose certificate
// was verified for another name (HTTP/2 connection reuse) from passing.
func (t *mutualTLS) verify(cs *tls.ConnectionState) (string, bool) {
	if cs == nil {
		return "", false
	}
	for _, chain := range cs.VerifiedChains {
		if len(chain) > 0 && t.roots[sha256.Sum256(chain[len(chain)-1].Raw)] {
			return printable(chain[0].Subject.String(), MaxIDBytes), true
		}
	}
	return "", false
}
