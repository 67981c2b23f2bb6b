package edge

import (
	"crypto/rand"
	"errors"
	"fmt"
	"iter"
	"net"
	"strings"
	"unicode"

	"golang.org/x/net/idna"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// The names agents may bind, and the URLs the edge hands back.

// hostNames validates a requested HTTP or TLS name and returns the names
// to try: the name itself under the domain (chosen is then true), or up to
// 8 random labels when req is empty.
func (s *Server) hostNames(req string) (names iter.Seq[string], chosen bool, err error) {
	domain, ok := router.Normalise(s.Domain)
	if !ok {
		return nil, false, errors.New("this edge serves no domain")
	}
	if req == "" {
		return func(yield func(string) bool) {
			for range 8 {
				if !yield(randomName() + "." + domain) {
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

// checkName returns the normalised pattern an agent asked for: one label
// under the domain ("abc"), or a name or wildcard under it. Labels are
// a-z, 0-9 and '-'; an "xn--" label must be valid IDNA in one script; "*"
// and "*.<domain>" need AllowCatchAll.
func (s *Server) checkName(req, domain string) (string, error) {
	name := strings.ToLower(strings.TrimSuffix(req, "."))
	if !strings.Contains(name, ".") {
		name += "." + domain
	}
	name, ok := router.NormalisePattern(name)
	if !ok || len(name) > 253 {
		return "", errors.New("invalid name: want DNS labels of a-z, 0-9 and '-'")
	}
	if !strings.HasSuffix(name, "."+domain) {
		return "", fmt.Errorf("invalid name: want a name under %s", domain)
	}
	if name == "*."+domain && !s.AllowCatchAll {
		return "", fmt.Errorf("invalid name: this edge does not hand out %s (every name under its domain)", name)
	}
	if rest := strings.TrimPrefix(name, "*."); rest != domain {
		for l := range strings.SplitSeq(strings.TrimSuffix(rest, "."+domain), ".") {
			if err := checkLabel(l); err != nil {
				return "", err
			}
		}
	}
	return name, nil
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

// checkLabel checks one label of a name to bind: 1 to 63 of a-z, 0-9 and
// '-', not starting or ending with '-'; "--" in the third and fourth place
// only for an "xn--" label (RFC 5891 reserves the others), which must be
// IDNA punycode that decodes to letters, marks and digits of one script
// (so "xn--pple-43d", a Cyrillic "а" before Latin "pple", is refused).
func checkLabel(l string) error {
	if !validLabel(l) {
		return errors.New("invalid name: want DNS labels of a-z, 0-9 and '-'")
	}
	if len(l) < 4 || l[2:4] != "--" {
		return nil
	}
	if !strings.HasPrefix(l, "xn--") {
		return fmt.Errorf("invalid name: label %q: '--' in the third and fourth place is reserved", l)
	}
	u, err := idna.Registration.ToUnicode(l)
	if err == nil {
		var back string
		if back, err = idna.Registration.ToASCII(u); err == nil && back != l {
			err = errors.New("does not round-trip")
		}
	}
	if err != nil {
		return fmt.Errorf("invalid name: label %q is not valid IDNA: %v", l, err)
	}
	if !oneScript(u) {
		return fmt.Errorf("invalid name: label %q (%s) mixes scripts or has symbols", l, wire.Printable(u, 64))
	}
	return nil
}

// oneScript reports whether every rune of a decoded label is a letter,
// mark, digit or '-', and its letters come from one script.
func oneScript(u string) bool {
	var script *unicode.RangeTable
	for _, r := range u {
		switch {
		case r == '-' || unicode.IsDigit(r) || unicode.IsMark(r):
			continue
		case !unicode.IsLetter(r):
			return false
		}
		if script != nil && unicode.Is(script, r) {
			continue
		}
		if script != nil {
			return false
		}
		for _, t := range unicode.Scripts {
			if unicode.Is(t, r) {
				script = t
				break
			}
		}
		if script == nil {
			return false
		}
	}
	return true
}

// validLabel reports whether s is one DNS label: 1 to 63 of a-z, 0-9 and
// '-', not starting or ending with '-'.
func validLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// randomName returns 10 random characters from a-z and 0-9.
func randomName() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 10)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
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
