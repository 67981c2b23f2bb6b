package names

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// Tickets are the edge's signed statements about an agent, which the agent
// keeps as opaque strings and presents back:
//
//   - a session ticket, given at the hello, names an identity and a
//     Session: an agent reconnecting with it takes over that session's
//     endpoints, and an anonymous agent gets its identity back;
//   - an endpoint ticket, given at each bind and renewed while the endpoint
//     lives, names an identity, a protocol and a name, and when it was
//     issued. The edge no longer decides anything on one: a Ticket shows
//     that its identity held a name once, not that nobody took the name
//     over since, so who gets a name back after a restart is the edge's
//     record's business (Server.StateDir), and no ticket overrides it.
//
// Tickets are signed with HMAC-SHA256 under Server.TicketKey; whoever holds
// that key can mint them, and a Ticket signed under another key is ignored.

// Ticket kinds.
const (
	TicketSession  uint8 = 1
	TicketEndpoint uint8 = 2
)

// ticketVersion is the first byte of every ticket's payload.
const ticketVersion = 1

// MaxTicket bounds a Ticket as sent: longer strings are not even decoded.
const MaxTicket = 1024

// MinTicketKey is the shortest TicketKey a Server accepts.
const MinTicketKey = 32

// ErrBadTicket is what Open says of anything but a ticket its Signer made.
var ErrBadTicket = errors.New("names: bad ticket")

// Ticket is what a ticket says.
type Ticket struct {
	Kind     uint8     // TicketSession or TicketEndpoint
	Issued   time.Time // to the second
	Identity string
	Session  string // session tickets
	Proto    string // endpoint tickets
	Name     string // endpoint tickets
}

// Signer signs and opens tickets under one key, of MinTicketKey bytes or
// more.
type Signer struct{ Key []byte }

// Sign returns t as a ticket string: its payload, then the HMAC-SHA256 of
// the payload, in unpadded base64url.
//
//	u8 version | u8 kind | u64 issued (Unix seconds) | u16 length, identity
//	| u8 length, session | u8 length, proto | u16 length, name | 32-byte MAC
func (ts Signer) Sign(t Ticket) (string, error) {
	if sec := t.Issued.Unix(); sec < 0 || sec > 1<<62 {
		return "", fmt.Errorf("%w: issued %v", ErrBadTicket, t.Issued)
	}
	var b cryptobyte.Builder
	b.AddUint8(ticketVersion)
	b.AddUint8(t.Kind)
	b.AddUint64(uint64(t.Issued.Unix()))
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.Identity)) })
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.Session)) })
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.Proto)) })
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.Name)) })
	payload, err := b.Bytes()
	if err != nil {
		return "", fmt.Errorf("names: ticket: %w", err)
	}
	out := base64.RawURLEncoding.EncodeToString(ts.mac(payload, payload))
	if len(out) > MaxTicket {
		return "", fmt.Errorf("%w: %d bytes", ErrBadTicket, len(out))
	}
	return out, nil
}

// mac appends the MAC of payload to b.
func (ts Signer) mac(b, payload []byte) []byte {
	h := hmac.New(sha256.New, ts.Key)
	h.Write(payload)
	return h.Sum(b)
}

// open verifies a Ticket string and returns what it says. Anything but a
// ticket this signer made fails with ErrBadTicket.
func (ts Signer) Open(s string) (Ticket, error) {
	if len(s) > MaxTicket {
		return Ticket{}, fmt.Errorf("%w: too long", ErrBadTicket)
	}
	// One ticket has one spelling: strict base64 (no stray bits in the last
	// character), and none of the line breaks the decoder would skip.
	if strings.ContainsAny(s, "\r\n") {
		return Ticket{}, fmt.Errorf("%w: not a Ticket", ErrBadTicket)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(raw) < sha256.Size {
		return Ticket{}, fmt.Errorf("%w: not a Ticket", ErrBadTicket)
	}
	payload, sum := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(ts.mac(nil, payload), sum) {
		return Ticket{}, fmt.Errorf("%w: signed under another key", ErrBadTicket)
	}
	in := cryptobyte.String(payload)
	var (
		version, kind                 uint8
		issued                        uint64
		identity, session, proto, nam cryptobyte.String
	)
	if !in.ReadUint8(&version) || version != ticketVersion || !in.ReadUint8(&kind) ||
		!in.ReadUint64(&issued) || !in.ReadUint16LengthPrefixed(&identity) ||
		!in.ReadUint8LengthPrefixed(&session) || !in.ReadUint8LengthPrefixed(&proto) ||
		!in.ReadUint16LengthPrefixed(&nam) || !in.Empty() || issued > 1<<62 {
		return Ticket{}, fmt.Errorf("%w: malformed", ErrBadTicket)
	}
	return Ticket{
		Kind:     kind,
		Issued:   time.Unix(int64(issued), 0),
		Identity: string(identity),
		Session:  string(session),
		Proto:    string(proto),
		Name:     string(nam),
	}, nil
}
