package names

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Names beside those agents bind under the domain: the operator's own
// (the public names of its ECH keys), customers' own domains outside the
// domain, the names an operator may reserve, and the URLs of endpoints.

// Operator returns why an agent may not bind name (a normalised pattern)
// because it is the operator's: its tree and the tree of one of public
// (the public names of the edge's ECH keys) overlap (router.Router's rule
// 2, a name owns its tree), so it is that name, above it (a wildcard over
// it, the catch-alls among them) or under it. Nil: name is not the
// operator's.
func Operator(name string, public map[string]bool) error {
	const what = "the edge's own name, the public name of its Encrypted ClientHello keys"
	base := strings.TrimPrefix(name, "*.")
	for p := range public {
		switch {
		case name == p:
			return fmt.Errorf("%s is %s", name, what)
		case base == p || strings.HasSuffix(p, "."+base):
			return fmt.Errorf("%s would own %s, %s", name, p, what)
		case strings.HasSuffix(base, "."+p):
			return fmt.Errorf("%s is under %s, %s", name, p, what)
		}
	}
	return nil
}

// Outside returns req, normalised, when it is a name a customer may own
// outside domain (a Host header's, a bind's): a host name, no wildcard,
// of two labels or more, each a label Check accepts, the last not all
// digits (no IPv4 address), that is neither domain, nor above it, nor
// under it, nor a public suffix or above one (PublicSuffix: co.uk, but
// shop.co.uk). ok is false for any other req.
func Outside(req, domain string) (name string, ok bool) {
	name, ok = router.Normalise(strings.ToLower(req))
	if !ok || len(name) > 253 || !strings.Contains(name, ".") || name == domain ||
		strings.HasSuffix(domain, "."+name) || strings.HasSuffix(name, "."+domain) || PublicSuffix(name) {
		return "", false
	}
	labels := strings.Split(name, ".")
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", false
	}
	for _, l := range labels {
		if checkLabel(l) != nil {
			return "", false
		}
	}
	return name, true
}

// Hosts returns the host names to try for a bind that asked for req
// under domain: up to 8 random labels under domain when req is empty
// (chosen is then false), or req, normalised, as Check has it (a wildcard
// "*.<domain>" needs catchAll) or as Outside has it (to be bound only if
// it is reserved for the agent, see Customer).
func Hosts(req, domain string, catchAll bool) (hosts iter.Seq[string], chosen bool, err error) {
	if domain == "" {
		return nil, false, errors.New("this edge serves no domain")
	}
	if req == "" {
		return func(yield func(string) bool) {
			for range 8 {
				if !yield(Random() + "." + domain) {
					return
				}
			}
		}, false, nil
	}
	name, err := Check(req, domain, catchAll)
	if outside, ok := Outside(req, domain); err != nil && ok {
		name, err = outside, nil
	}
	if err != nil {
		return nil, true, err
	}
	return func(yield func(string) bool) { yield(name) }, true, nil
}

// Customer returns the agent's answer to a bind by identity of name, a
// normalised pattern of a host name, when name is outside domain and rs
// (nil if the edge's Router keeps no reservations) has no reservation of
// it for identity; nil for a name under domain, or reserved for identity.
func Customer(ctx context.Context, rs router.Reserver, name, domain, identity string) *wire.Error {
	if strings.HasSuffix(name, "."+domain) {
		return nil
	}
	if rs != nil {
		res, found, err := rs.Reservation(ctx, name)
		switch {
		case err != nil:
			return &wire.Error{Code: wire.CodeUnavailable, Message: "the reservations of names cannot be read now"}
		case found && res.Identity == identity:
			return nil
		}
	}
	return &wire.Error{Code: wire.CodeBadRequest, Message: fmt.Sprintf("invalid name: %s is not under %s, and not reserved for you", name, domain)}
}

// Reservation returns the reservation the operator asks for with req and
// identity (which CheckIdentity accepts): req a host name under domain
// (one label is a name under it, as agents ask), or one a customer may own
// outside it (Outside), spelled as ReservationName has it; never a
// wildcard, nor an operator's name (see Operator).
func Reservation(req, identity, domain string, public map[string]bool) (router.Reservation, error) {
	name, ok := Outside(req, domain)
	var err error
	bad := fmt.Errorf("%q: want a host name under %s, or a customer's own outside it (not %s or above it)", wire.Printable(req, 253), domain, domain)
	switch normalised, valid := ReservationName(req, domain); {
	case strings.HasPrefix(req, "*"):
		err = errors.New("a reservation is of a name, which holds its tree: leave out the wildcard")
	case CheckIdentity(identity) != nil:
		err = CheckIdentity(identity)
	case !valid:
		err = bad
	case !ok && !strings.HasSuffix(normalised, "."+domain) && PublicSuffix(normalised):
		err = fmt.Errorf("%s is a public suffix, or above one (publicsuffix.org): names under it belong to whoever registers them; reserve a customer's own domain, such as shop.%s", normalised, normalised)
	case !ok:
		if name, err = Check(req, domain, false); err != nil {
			err = bad
		}
	}
	if err == nil {
		err = Operator(name, public)
	}
	return router.Reservation{Name: name, Identity: identity}, err
}

// URL returns the URL of r that agents and logs show: for http, https and
// tls, its name with the port of the listener (httpPort for http, tlsPort
// for the others) unless it is the scheme's default; for tcp, tcpHost and
// its port. An http or https route's path follows.
func URL(r router.Route, httpPort, tlsPort, tcpHost string) string {
	switch r.Proto {
	case wire.ProtoTCP:
		return "tcp://" + net.JoinHostPort(tcpHost, r.Name)
	case wire.ProtoTLS:
		return "tls://" + WithPort(r.Name, tlsPort, "443")
	case wire.ProtoHTTPS:
		return "https://" + WithPort(r.Name, tlsPort, "443") + r.Path
	}
	return "http://" + WithPort(r.Name, httpPort, "80") + r.Path
}

// WithPort joins host and port, leaving out the scheme's default port
// def.
func WithPort(host, port, def string) string {
	if port == "" || port == def {
		return host
	}
	return net.JoinHostPort(host, port)
}
