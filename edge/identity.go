package edge

import (
	"fmt"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
)

// MaxIdentity bounds an identity, in bytes (see CheckIdentity): an e-mail
// address or an OpenID Connect subject fits.
const MaxIdentity = names.MaxIdentity

// CheckIdentity returns an error wrapping ErrInvalidIdentity, which says
// why, when id cannot be an identity; nil when it can. An identity is 1 to
// MaxIdentity bytes of UTF-8, each character printable: no control or
// format character, no space of any kind, so that it reads the same in a
// log line, the record of StateDir, a shared Router's store and a ticket.
// The edge refuses an agent whose token Authenticate answers with another
// identity, and Reserve refuses one; a loader of tokens should refuse it
// first.
func CheckIdentity(id string) error {
	if err := names.CheckIdentity(id); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidIdentity, err)
	}
	return nil
}
