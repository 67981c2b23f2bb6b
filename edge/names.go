package edge

import (
	"errors"
	"fmt"
	"iter"
	"net"
	"strings"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// The names agents may bind, and the URLs the edge hands back.

// hostNames validates a requested HTTP or TLS name and returns the names
// to try: the name itself under the domain (chosen is then true), or up to
// 8 random labels when req is empty.
func (s *Server) hostNames(req string) (hosts iter.Seq[string], chosen bool, err error) {
	domain, ok := router.Normalise(s.Domain)
	if !ok {
		return nil, false, errors.New("this edge serves no domain")
	}
	if req == "" {
		return func(yield func(string) bool) {
			for range 8 {
				if !yield(names.Random() + "." + domain) {
					return
				}
			}
		}, false, nil
	}
	name, err := s.checkName(req, domain)
	if err != nil {
		return nil, true, err
	}
	return func(yield func(string) bool) { yield(name) }, true, nil
}

// checkName returns the normalised pattern an agent asked for (see
// names.Check); "*" and "*.<domain>" need AllowCatchAll.
func (s *Server) checkName(req, domain string) (string, error) {
	return names.Check(req, domain, s.AllowCatchAll)
}

// operatorName returns why an agent may not bind name (a normalised
// pattern) because it is the operator's: its tree and the tree of a public
// name of the ECH keys overlap (router.Router's rule 2, a name owns its
// tree), so it is that name, above it (a wildcard over it, the catch-alls
// among them) or under it. Nil: name is not the operator's.
func (s *Server) operatorName(name string) error {
	s.initECH() // the public names are known even when the keys are not valid
	const what = "the edge's own name, the public name of its Encrypted ClientHello keys"
	base := strings.TrimPrefix(name, "*.")
	for public := range s.ech.publicNames {
		switch {
		case name == public:
			return fmt.Errorf("%s is %s", name, what)
		case base == public || strings.HasSuffix(public, "."+base):
			return fmt.Errorf("%s would own %s, %s", name, public, what)
		case strings.HasSuffix(base, "."+public):
			return fmt.Errorf("%s is under %s, %s", name, public, what)
		}
	}
	return nil
}

// publicURL is the URL of r that agents and logs show.
func (s *Server) publicURL(r router.Route) string {
	s.mu.Lock()
	httpPort, tlsPort := s.httpPort, s.tlsPort
	s.mu.Unlock()
	switch r.Proto {
	case wire.ProtoTCP:
		return "tcp://" + net.JoinHostPort(s.tcpURLHost(), r.Name)
	case wire.ProtoTLS:
		return "tls://" + withPort(r.Name, tlsPort, "443")
	case wire.ProtoHTTPS:
		return "https://" + withPort(r.Name, tlsPort, "443")
	}
	return "http://" + withPort(r.Name, httpPort, "80")
}

// withPort joins host and port, leaving out the scheme's default port.
func withPort(host, port, def string) string {
	if port == "" || port == def {
		return host
	}
	return net.JoinHostPort(host, port)
}
