package names

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tunnelkit/tunnelkit/router"
	"golang.org/x/net/publicsuffix"
)

// Who holds names, and how the operator's reservations spell them: the
// checks on what the operator's API and Authenticate hand the edge.

// MaxIdentity bounds an identity, in bytes: an e-mail address (254 bytes
// at most) or an OpenID Connect subject (255 ASCII characters at most)
// fits, and no identity longer than a line of a log is one a person reads.
const MaxIdentity = 255

// CheckIdentity returns why id cannot be an identity, or nil: an identity
// is 1 to MaxIdentity bytes of UTF-8, each character printable (no
// control or format character, no space of any kind), so that it reads
// the same in a log line, a record line, an etcd key and a ticket.
func CheckIdentity(id string) error {
	switch {
	case id == "":
		return errors.New("no identity")
	case len(id) > MaxIdentity:
		return fmt.Errorf("an identity of %d bytes, more than %d", len(id), MaxIdentity)
	case !utf8.ValidString(id):
		return errors.New("an identity that is not UTF-8")
	}
	for i, r := range id {
		if r == ' ' || !unicode.IsPrint(r) {
			return fmt.Errorf("an identity with a space or a character that does not print (%U) at byte %d", r, i)
		}
	}
	return nil
}

// ReservationName returns req as the operator's reservation of it is
// stored and looked up (Reservation, and Server.Unreserve): in lower case,
// without a trailing dot, one label standing for the name under domain
// ("Shop" is "shop.<domain>"). ok is false when req is then not a host
// name.
func ReservationName(req, domain string) (name string, ok bool) {
	name = strings.ToLower(strings.TrimSuffix(req, "."))
	if strings.HasSuffix(name, ".") {
		return "", false // one trailing dot at most
	}
	if name != "" && !strings.Contains(name, ".") && domain != "" {
		name += "." + domain
	}
	return router.Normalise(name)
}

// PublicSuffix reports whether name (normalised) is a public suffix or
// above one, as the Public Suffix List has it (co.uk, com, github.io):
// names under it belong to whoever registers them, so nobody owns it.
func PublicSuffix(name string) bool {
	_, err := publicsuffix.EffectiveTLDPlusOne(name)
	return err != nil
}
