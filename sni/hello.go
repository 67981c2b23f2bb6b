package sni

import (
	"fmt"
	"strings"

	"golang.org/x/crypto/cryptobyte"
)

// TLS extension types this package reads.
const (
	extServerName        uint16 = 0      // RFC 6066
	extALPN              uint16 = 16     // RFC 7301
	extSupportedVersions uint16 = 43     // RFC 8446
	extECH               uint16 = 0xfe0d // encrypted_client_hello, RFC 9849
	nameTypeHostName     uint8  = 0
)

// A ClientHello holds what a router needs from a TLS ClientHello. A
// ClientHello is only ever returned with a nil error.
type ClientHello struct {
	// ServerName is the host name of the server_name extension (SNI),
	// normalised for routing: ASCII letters in lower case and one trailing
	// dot removed, so "Example.COM." gives "example.com". It is a valid host
	// name: labels of 1 to 63 letters, digits, '-' or '_' (hyphens and
	// underscores anywhere), separated by single dots, 253 bytes at most, and
	// a last label that is not all digits, which rules out IPv4 literals
	// (":" rules out IPv6 ones). Non-ASCII names are sent as A-labels
	// ("xn--..."), which pass. A hello whose name breaks these rules fails
	// with ErrInvalidName instead.
	//
	// Empty means the hello has no server_name extension, or one without a
	// host_name entry: the client did not say which server it wants.
	ServerName string

	// RawServerName is the host name exactly as the client sent it; empty
	// when ServerName is.
	RawServerName string

	// ALPN lists the protocols of the application_layer_protocol_negotiation
	// extension, in the client's order of preference, as sent. Nil means the
	// client sent no ALPN extension.
	ALPN []string

	// ECH reports whether the hello carries an encrypted_client_hello
	// extension (0xfe0d). Presence proves little: browsers send a GREASE
	// (fake) one to servers that have not published ECH keys. When ECH is
	// real, this is the outer hello, and ServerName is the public name of
	// the ECH configuration, not the name the client wants to reach, which
	// only the holder of the ECH key can decrypt.
	ECH bool

	// RecordVersion is the legacy_record_version of the first TLS record
	// of the hello: 0x0301 for most clients, which RFC 8446 allows in an
	// initial ClientHello for compatibility, 0x0303 after a
	// HelloRetryRequest.
	RecordVersion uint16

	// Version is the hello's legacy_version field: 0x0303 for TLS 1.2 and
	// TLS 1.3 clients, which offer TLS 1.3 through SupportedVersions.
	Version uint16

	// SupportedVersions lists the supported_versions extension, in the
	// client's order, without GREASE values. Nil means the client sent none,
	// which means it offers at most the TLS version in Version.
	SupportedVersions []uint16

	// Raw is the complete ClientHello handshake message (type byte, 3-byte
	// length, body), reassembled if it spanned several records, without
	// record headers. Treat it as read-only: it may share memory with the
	// bytes given to Parse or replayed by the conn Peek returns.
	Raw []byte
}

// Parse parses a ClientHello from b, the bytes of a TLS stream as they come
// off the wire: one or more TLS records, starting with the first byte the
// client sent (0x16). A ClientHello split over several records is
// reassembled. Bytes after the record that ends the ClientHello are ignored.
//
// Parse returns ErrIncomplete if b is a valid but incomplete beginning of a
// ClientHello, ErrNotTLS if b[0] is not 0x16, ErrTooLarge for a record length
// above 2^14, ErrMalformed for bytes that cannot become a ClientHello, and
// ErrInvalidName if the server name is not a valid host name. Parse sets no
// limit on the size of the hello other than len(b).
//
// The returned ClientHello's Raw may share memory with b.
func Parse(b []byte) (*ClientHello, error) {
	var a assembler
	msg, err := a.feed(b)
	if err != nil {
		return nil, err
	}
	h, err := parseHello(msg)
	if err != nil {
		return nil, err
	}
	h.RecordVersion = a.version
	return h, nil
}

// parseHello parses a complete ClientHello handshake message, header
// included, as returned by assembler.feed.
func parseHello(msg []byte) (*ClientHello, error) {
	var (
		msgType                               uint8
		version                               uint16
		body, sessionID, suites, compressions cryptobyte.String
		extensions                            cryptobyte.String
		f                                     fields
	)
	s := cryptobyte.String(msg)
	if !s.ReadUint8(&msgType) || msgType != typeClientHello ||
		!s.ReadUint24LengthPrefixed(&body) || !s.Empty() {
		return nil, fmt.Errorf("%w: bad handshake header", ErrMalformed)
	}
	if !body.ReadUint16(&version) ||
		!body.Skip(32) || // random
		!body.ReadUint8LengthPrefixed(&sessionID) ||
		!body.ReadUint16LengthPrefixed(&suites) || len(suites)%2 != 0 ||
		!body.ReadUint8LengthPrefixed(&compressions) {
		return nil, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	// The extensions block is optional: old hellos end here.
	if !body.Empty() && (!body.ReadUint16LengthPrefixed(&extensions) || !body.Empty()) {
		return nil, fmt.Errorf("%w: bad extensions block", ErrMalformed)
	}
	for !extensions.Empty() {
		var typ uint16
		var data cryptobyte.String
		if !extensions.ReadUint16(&typ) || !extensions.ReadUint16LengthPrefixed(&data) {
			return nil, fmt.Errorf("%w: truncated extension", ErrMalformed)
		}
		if err := f.extension(typ, data); err != nil {
			return nil, err
		}
	}
	return f.clientHello(msg, version)
}

// fields holds what parseHello found in the extensions: slices of the
// message, turned into a ClientHello by clientHello.
type fields struct {
	seenServerName, seenALPN, seenVersions, ech bool

	hostName cryptobyte.String // nil: no host_name entry
	alpn     cryptobyte.String // the protocol_name_list; nil: no ALPN
	versions cryptobyte.String // the versions list; nil: none
}

// extension reads one extension. Every extension this package reads must
// appear at most once (RFC 8446, section 4.2): a repeated one could make this
// package and the TLS server see different values. Other extensions are
// skipped unread, GREASE ones included.
func (f *fields) extension(typ uint16, data cryptobyte.String) error {
	var seen *bool
	switch typ {
	case extServerName:
		seen = &f.seenServerName
	case extALPN:
		seen = &f.seenALPN
	case extSupportedVersions:
		seen = &f.seenVersions
	case extECH:
		seen = &f.ech
	default:
		return nil
	}
	if *seen {
		return fmt.Errorf("%w: extension %#04x repeated", ErrMalformed, typ)
	}
	*seen = true

	switch typ {
	case extServerName:
		var list cryptobyte.String
		if !data.ReadUint16LengthPrefixed(&list) || list.Empty() || !data.Empty() {
			return fmt.Errorf("%w: bad server_name extension", ErrMalformed)
		}
		for !list.Empty() {
			var nameType uint8
			var name cryptobyte.String
			if !list.ReadUint8(&nameType) || !list.ReadUint16LengthPrefixed(&name) {
				return fmt.Errorf("%w: bad server_name extension", ErrMalformed)
			}
			if nameType != nameTypeHostName {
				continue // other name types are skipped, as crypto/tls does
			}
			if f.hostName != nil {
				// RFC 6066 allows one name of each type. Taking the
				// first or the last could route to a backend that the
				// TLS server then disagrees with; crypto/tls rejects it.
				return fmt.Errorf("%w: two host_name entries", ErrMalformed)
			}
			if name.Empty() {
				return fmt.Errorf("%w: empty host_name", ErrMalformed)
			}
			f.hostName = name
		}
	case extALPN:
		var list cryptobyte.String
		if !data.ReadUint16LengthPrefixed(&list) || list.Empty() || !data.Empty() {
			return fmt.Errorf("%w: bad ALPN extension", ErrMalformed)
		}
		for l := list; !l.Empty(); {
			var proto cryptobyte.String
			if !l.ReadUint8LengthPrefixed(&proto) || proto.Empty() {
				return fmt.Errorf("%w: bad ALPN extension", ErrMalformed)
			}
		}
		f.alpn = list
	case extSupportedVersions:
		var list cryptobyte.String
		if !data.ReadUint8LengthPrefixed(&list) || list.Empty() || len(list)%2 != 0 || !data.Empty() {
			return fmt.Errorf("%w: bad supported_versions extension", ErrMalformed)
		}
		f.versions = list
	}
	return nil
}

// inlineALPN and inlineVersions size the arrays that hold short ALPN and
// version lists in the same allocation as the ClientHello.
const (
	inlineALPN     = 3
	inlineVersions = 4
)

// clientHello builds the ClientHello in at most two allocations: one for the
// struct and its short slices, one for all its strings.
func (f *fields) clientHello(msg []byte, version uint16) (*ClientHello, error) {
	nameLen, upper, err := checkHostName(f.hostName)
	if err != nil {
		return nil, err
	}

	var mem struct {
		h        ClientHello
		alpn     [inlineALPN]string
		versions [inlineVersions]uint16
	}
	p := &mem // the one allocation for the struct
	h := &p.h
	h.Version = version
	h.ECH = f.ech
	h.Raw = msg

	// All strings share one backing string: the raw name, the lower-case
	// name if it differs, then the ALPN protocols.
	size := len(f.hostName) + len(f.alpn)
	if upper {
		size += nameLen
	}
	var sb strings.Builder
	sb.Grow(size)
	sb.Write(f.hostName)
	if upper {
		for _, c := range f.hostName[:nameLen] {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			sb.WriteByte(c)
		}
	}
	nALPN := 0
	for l := f.alpn; !l.Empty(); nALPN++ {
		var proto cryptobyte.String
		l.ReadUint8LengthPrefixed(&proto)
		sb.Write(proto)
	}
	all := sb.String()

	h.RawServerName, all = all[:len(f.hostName)], all[len(f.hostName):]
	h.ServerName = h.RawServerName[:nameLen]
	if upper {
		h.ServerName, all = all[:nameLen], all[nameLen:]
	}
	if f.alpn != nil {
		h.ALPN = p.alpn[:0:inlineALPN]
		if nALPN > inlineALPN {
			h.ALPN = make([]string, 0, nALPN)
		}
		for l := f.alpn; !l.Empty(); {
			var proto cryptobyte.String
			l.ReadUint8LengthPrefixed(&proto)
			h.ALPN = append(h.ALPN, all[:len(proto)])
			all = all[len(proto):]
		}
	}
	if f.versions != nil {
		h.SupportedVersions = p.versions[:0:inlineVersions]
		for l := f.versions; !l.Empty(); {
			var v uint16
			l.ReadUint16(&v)
			if !isGREASE(v) {
				h.SupportedVersions = append(h.SupportedVersions, v)
			}
		}
	}
	return h, nil
}

// isGREASE reports whether v is one of the reserved GREASE values of RFC
// 8701: 0x0a0a, 0x1a1a, ..., 0xfafa.
func isGREASE(v uint16) bool {
	return v&0x0f0f == 0x0a0a && v>>8 == v&0xff
}
