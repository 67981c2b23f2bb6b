package edge

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
//     session: an agent reconnecting with it takes over that session's
//     endpoints, and an anonymous agent gets its identity back;
//   - an endpoint ticket, given at each bind and renewed while the endpoint
//     lives, names an identity, a protocol and a name, and when it was
//     issued. The edge no longer decides anything on one: a ticket shows
//     that its identity held a name once, not that nobody took the name
//     over since, so who gets a name back after a restart is the edge's
//     record's business (Server.StateDir), and no ticket overrides it.
//
// Tickets are signed with HMAC-SHA256 under Server.TicketKey; whoever holds
// that key can mint them, and a ticket signed under another key is ignored.

// Ticket kinds.
const (
	ticketSession  uint8 = 1
	ticketEndpoint uint8 = 2
)

// ticketVersion is the first byte of every ticket's payload.
const ticketVersion = 1

// maxTicket bounds a ticket as sent: longer strings are not even decoded.
const maxTicket = 1024

// minTicketKey is the shortest TicketKey a Server accepts.
const minTicketKey = 32

var errBadTicket = errors.New("edge: bad ticket")

type ticket struct {
	kind     uint8
	issued   time.Time // to the second
	identity string
	session  string // session tickets
	proto    string // endpoint tickets
	name     string // endpoint tickets
}

// ticketSigner signs and opens tickets under one key.
type ticketSigner struct{ key []byte }

// sign returns t as a ticket string: its payload, then the HMAC-SHA256 of
// the payload, in unpadded base64url.
//
//	u8 version | u8 kind | u64 issued (Unix seconds) | u16 length, identity
//	| u8 length, session | u8 length, proto | u16 length, name | 32-byte MAC
func (ts ticketSigner) sign(t ticket) (string, error) {
	if sec := t.issued.Unix(); sec < 0 || sec > 1<<62 {
		return "", fmt.Errorf("%w: issued %v", errBadTicket, t.issued)
	}
	var b cryptobyte.Builder
	b.AddUint8(ticketVersion)
	b.AddUint8(t.kind)
	b.AddUint64(uint64(t.issued.Unix()))
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.identity)) })
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.session)) })
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.proto)) })
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(t.name)) })
	payload, err := b.Bytes()
	if err != nil {
		return "", fmt.Errorf("edge: ticket: %w", err)
	}
	out := base64.RawURLEncoding.EncodeToString(ts.mac(payload, payload))
	if len(out) > maxTicket {
		return "", fmt.Errorf("%w: %d bytes", errBadTicket, len(out))
	}
	return out, nil
}

// mac appends the MAC of payload to b.
func (ts ticketSigner) mac(b, payload []byte) []byte {
	h := hmac.New(sha256.New, ts.key)
	h.Write(payload)
	return h.Sum(b)
}

// open verifies a ticket string and returns what it says. Anything but a
// ticket this signer made fails with errBadTicket.
func (ts ticketSigner) open(s string) (ticket, error) {
	if len(s) > maxTicket {
		return ticket{}, fmt.Errorf("%w: too long", errBadTicket)
	}
	// One ticket has one spelling: strict base64 (no stray bits in the last
	// character), and none of the line breaks the decoder would skip.
	if strings.ContainsAny(s, "\r\n") {
		return ticket{}, fmt.Errorf("%w: not a ticket", errBadTicket)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(raw) < sha256.Size {
		return ticket{}, fmt.Errorf("%w: not a ticket", errBadTicket)
	}
	payload, sum := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(ts.mac(nil, payload), sum) {
		return ticket{}, fmt.Errorf("%w: signed under another key", errBadTicket)
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
		return ticket{}, fmt.Errorf("%w: malformed", errBadTicket)
	}
	return ticket{
		kind:     kind,
		issued:   time.Unix(int64(issued), 0),
		identity: string(identity),
		session:  string(session),
		proto:    string(proto),
		name:     string(nam),
	}, nil
}
