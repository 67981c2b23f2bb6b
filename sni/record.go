package sni

import (
	"fmt"

	"golang.org/x/crypto/cryptobyte"
)

const (
	recordTypeHandshake uint8 = 0x16 // TLS ContentType handshake(22)
	recordHeaderLen           = 5    // ContentType, ProtocolVersion, uint16 length
	maxRecordLen              = 1 << 14
	handshakeHeaderLen        = 4 // HandshakeType, uint24 length
	typeClientHello     uint8 = 1
)

// An assembler gathers the ClientHello handshake message out of TLS records
// whose bytes arrive in pieces. It is fed the whole stream read so far each
// time, keeps only offsets into it and a copy of the handshake bytes of the
// records it has finished, so each record is walked once, and it reports an
// error as soon as the bytes at hand rule a ClientHello out.
type assembler struct {
	// max is the most stream bytes a hello may need, record headers
	// included; zero means no limit.
	max int
	// next is the offset of the first record not yet consumed.
	next int
	// hs holds the handshake bytes of the records consumed so far.
	hs []byte
	// msgAt is the offset in b of the message feed returned, if it
	// aliases b (it lies in the first record), and -1 if it is a copy.
	msgAt int
	// version is the legacy_record_version of the first record, once its
	// header is read.
	version uint16
	// end is the offset in b just past the record that holds the last
	// byte of the message feed returned (which may lie beyond len(b): the
	// message can end before its record does), and tail the number of
	// handshake bytes of that record after the message.
	end, tail int
}

// feed examines b, every byte of the stream read so far (b holds the same
// bytes at the same offsets on each call, and only grows). It returns the
// complete ClientHello handshake message (header and body), which aliases b
// when it lies in the first record; ErrIncomplete when b is a valid beginning
// that more bytes could complete; or another error when no byte could.
//
// The ClientHello ends where its handshake length says; the rest of the
// record holding its last byte, and whatever follows, is not examined.
func (a *assembler) feed(b []byte) ([]byte, error) {
	for {
		rest := cryptobyte.String(b[a.next:])
		var typ, major, minor uint8
		var length uint16
		if !rest.ReadUint8(&typ) {
			return nil, ErrIncomplete
		}
		if typ != recordTypeHandshake {
			if a.next == 0 {
				return nil, ErrNotTLS
			}
			return nil, fmt.Errorf("%w: record of type %d inside the ClientHello", ErrMalformed, typ)
		}
		if !rest.ReadUint8(&major) {
			return nil, ErrIncomplete
		}
		if major != 3 {
			return nil, fmt.Errorf("%w: record version %d.x", ErrMalformed, major)
		}
		if !rest.ReadUint8(&minor) || !rest.ReadUint16(&length) {
			return nil, ErrIncomplete
		}
		if a.next == 0 {
			a.version = uint16(major)<<8 | uint16(minor)
		}
		if length > maxRecordLen {
			return nil, fmt.Errorf("%w: record length %d over %d", ErrTooLarge, length, maxRecordLen)
		}
		if length == 0 {
			return nil, fmt.Errorf("%w: empty handshake record", ErrMalformed)
		}
		body := []byte(rest)
		complete := len(body) >= int(length)
		if complete {
			body = body[:length]
		}

		// The handshake header may be split over records: look at the
		// handshake bytes gathered so far followed by this record's.
		var hdr [handshakeHeaderLen]byte
		n := copy(hdr[:], a.hs)
		n += copy(hdr[n:], body)
		h := cryptobyte.String(hdr[:n])
		var msgType uint8
		var bodyLen uint32
		if h.ReadUint8(&msgType) && msgType != typeClientHello {
			return nil, fmt.Errorf("%w: handshake message of type %d, not ClientHello", ErrMalformed, msgType)
		}
		msgLen := -1 // unknown until the header is whole
		if h.ReadUint24(&bodyLen) {
			msgLen = handshakeHeaderLen + int(bodyLen)
			// The stream needs at least this record's header and the
			// rest of the message after what it already holds.
			if need := a.next + recordHeaderLen + msgLen - len(a.hs); a.max > 0 && need > a.max {
				return nil, fmt.Errorf("%w: a %d-byte ClientHello needs over %d bytes", ErrTooLarge, msgLen, a.max)
			}
			if len(a.hs)+len(body) >= msgLen {
				a.end = a.next + recordHeaderLen + int(length)
				a.tail = int(length) - (msgLen - len(a.hs))
				if a.next == 0 {
					a.msgAt = recordHeaderLen
					return body[:msgLen:msgLen], nil
				}
				a.msgAt = -1
				return append(a.hs, body[:msgLen-len(a.hs)]...), nil
			}
		}
		if !complete {
			return nil, ErrIncomplete
		}
		if a.hs == nil && msgLen > 0 {
			// Room for the whole message, but never more than the
			// bytes at hand: the length is the peer's word.
			a.hs = make([]byte, 0, min(msgLen, len(b)))
		}
		a.hs = append(a.hs, body...)
		a.next += recordHeaderLen + int(length)
	}
}
