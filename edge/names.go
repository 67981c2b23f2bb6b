package edge

import (
	"iter"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/router"
)

// The names agents may bind, and the URLs the edge hands back (package
// names).

// hostNames validates a requested HTTP or TLS name and returns the names
// to try (see names.Hosts).
func (s *Server) hostNames(req string) (hosts iter.Seq[string], chosen bool, err error) {
	return names.Hosts(req, s.domain(), s.AllowCatchAll)
}

// domain is Domain, normalised; empty if it is not a host name.
func (s *Server) domain() string {
	d, _ := router.Normalise(s.Domain)
	return d
}

// operatorName returns why an agent may not bind name (a normalised
// pattern) because it is the operator's (see names.Operator); nil if not.
func (s *Server) operatorName(name string) error {
	s.initECH() // the public names are known even when the keys are not valid
	return names.Operator(name, s.ech.publicNames)
}

// publicURL is the URL of r that agents and logs show.
func (s *Server) publicURL(r router.Route) string {
	s.mu.Lock()
	httpPort, tlsPort := s.httpPort, s.tlsPort
	s.mu.Unlock()
	return names.URL(r, httpPort, tlsPort, s.tcpURLHost())
}
