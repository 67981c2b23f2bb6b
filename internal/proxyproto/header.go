package proxyproto

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"

	"golang.org/x/crypto/cryptobyte"
)

// The signatures that start a header of each version.
var (
	sigV1 = []byte("PROXY ")
	sigV2 = []byte("\r\n\r\n\x00\r\nQUIT\n")
)

// maxV1Len is the most bytes a version 1 header takes, CRLF included: the
// spec's worst case, "PROXY UNKNOWN" with two full IPv6 addresses and ports.
const maxV1Len = 107

// Version 2 fields (spec section 2.2).
const (
	v2Version = 0x2 // the high nibble of the ver_cmd byte

	// The fam byte: address family in the high nibble, transport in the low.
	famUnspec      = 0x00
	famTCP4        = 0x11
	famUDP4        = 0x12
	famTCP6        = 0x21
	famUDP6        = 0x22
	famUnixStream  = 0x31
	famUnixDgram   = 0x32
	transportDgram = 0x2 // in the low nibble

	// addrLenUnix is the size of an AF_UNIX address block: two 108-byte
	// paths, as in struct sockaddr_un.
	addrLenUnix = 2 * 108
)

// A Command says whether a header carries the addresses of a relayed
// connection. Version 2 writes it on the wire; for version 1, Read reports
// Proxy for TCP4 and TCP6 headers and Local for UNKNOWN ones.
type Command uint8

const (
	// Local means the connection carries no relayed client: the proxy made
	// it on its own behalf (a health check, say), or did not know the
	// client's address. The receiver uses the connection's own addresses.
	// Its header carries no addresses.
	Local Command = 0x0

	// Proxy means the connection relays a client's, whose addresses the
	// header carries (unless they are unknown: version 2 family AF_UNSPEC or
	// AF_UNIX, which Read reports as zero addresses).
	Proxy Command = 0x1
)

// String returns "LOCAL" or "PROXY", as the spec names them.
func (c Command) String() string {
	switch c {
	case Local:
		return "LOCAL"
	case Proxy:
		return "PROXY"
	}
	return "Command(" + strconv.Itoa(int(c)) + ")"
}

// Types of the TLVs the spec defines (section 2.2.1 onwards). Read returns
// every TLV raw, whatever its type, and does not interpret or check any of
// them (it does not verify a TypeCRC32C checksum).
const (
	TypeALPN      = 0x01 // the ALPN protocol negotiated, as bytes
	TypeAuthority = 0x02 // the host name the client asked for (SNI), UTF-8
	TypeCRC32C    = 0x03 // a CRC32c checksum of the header
	TypeNoop      = 0x04 // padding, to be ignored
	TypeUniqueID  = 0x05 // an opaque connection ID, at most 128 bytes
	TypeSSL       = 0x20 // TLS information, with sub-TLVs
	TypeNetNS     = 0x30 // the network namespace's name, US-ASCII
)

// A TLV is one type-length-value field of a version 2 header, raw.
type TLV struct {
	Type  uint8
	Value []byte // at most 65535 bytes
}

// A Header is a PROXY protocol header, version 1 or 2.
//
// Addresses are held unmapped: Read turns an IPv4-mapped IPv6 address
// (::ffff:192.0.2.1) into the IPv4 address, and writing does the same before
// choosing the family, so an IPv4 client is written as TCP4 or AF_INET. When
// one address is IPv4 and the other IPv6, both are written as IPv6, the IPv4
// one mapped, and read back unmapped. Zones are never written.
type Header struct {
	// Version is 1 (the text format) or 2 (the binary format). Writing a
	// header with any other version fails with ErrInvalidHeader.
	Version int

	// Command is Proxy for a relayed connection, Local otherwise (see the
	// constants). A Local header is written without addresses: version 1
	// "PROXY UNKNOWN", version 2 LOCAL with family AF_UNSPEC.
	Command Command

	// Source is the client's address, the far end of the relayed connection.
	// The zero value means unknown: Read returns it for a Local header or
	// when the header carries no IP addresses, and a Proxy header with an
	// unknown Source is written as version 1 "PROXY UNKNOWN" or version 2
	// PROXY with family AF_UNSPEC.
	Source netip.AddrPort

	// Destination is the address the client connected to, on the proxy.
	// Read returns it valid whenever Source is. If it is the zero value when
	// Source is valid, the unspecified address of Source's family, port 0,
	// is written.
	Destination netip.AddrPort

	// TLVs are the version 2 TLVs, raw, in order. Read returns nil when there
	// are none (and always for version 1); writing a version 1 header with
	// TLVs fails with ErrInvalidHeader. The Values returned by Read share
	// one buffer, owned by the Header.
	TLVs []TLV
}

// Append appends the header, in the format its Version says, to b. It
// returns b unchanged and an error wrapping ErrInvalidHeader if the header
// cannot be written: see that error.
func (h *Header) Append(b []byte) ([]byte, error) {
	if h.Command != Local && h.Command != Proxy {
		return b, fmt.Errorf("%w: unknown command %v", ErrInvalidHeader, h.Command)
	}
	switch h.Version {
	case 1:
		return h.appendV1(b)
	case 2:
		return h.appendV2(b)
	}
	return b, fmt.Errorf("%w: version %d, want 1 or 2", ErrInvalidHeader, h.Version)
}

// WriteTo writes the header to w in a single Write call, so that it can be
// the first bytes of a stream that other goroutines are not yet writing to.
// It returns the bytes written and an error wrapping ErrInvalidHeader if the
// header cannot be written, io.ErrShortWrite if w accepted only part of it,
// or w's error.
func (h *Header) WriteTo(w io.Writer) (int64, error) {
	b, err := h.Append(make([]byte, 0, 128))
	if err != nil {
		return 0, err
	}
	n, err := w.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return int64(n), fmt.Errorf("proxyproto: writing the header: %w", err)
	}
	return int64(n), nil
}

// Write writes a PROXY protocol header of the given version (1 or 2) for a
// connection from src to dst, in a single Write call to w: call it before
// anything else is written to w.
//
// If src is the zero value (unknown), the header says so: version 1
// "PROXY UNKNOWN", version 2 LOCAL with family AF_UNSPEC, and the receiver
// uses the connection's own addresses. Otherwise it is a Proxy header; see
// Header for how IPv4-mapped and mixed addresses, and a zero dst, are written.
func Write(w io.Writer, version int, src, dst netip.AddrPort) error {
	h := Header{Version: version, Command: Proxy, Source: src, Destination: dst}
	if !src.IsValid() {
		h.Command = Local
	}
	_, err := h.WriteTo(w)
	return err
}

// addrs returns the addresses to write, unmapped, without zones and of one
// family, or ok false if the header is to carry none.
func (h *Header) addrs() (src, dst netip.AddrPort, ok bool) {
	if h.Command != Proxy || !h.Source.IsValid() {
		return src, dst, false
	}
	s := h.Source.Addr().Unmap().WithZone("")
	var d netip.Addr
	switch {
	case h.Destination.IsValid():
		d = h.Destination.Addr().Unmap().WithZone("")
	case s.Is4():
		d = netip.IPv4Unspecified()
	default:
		d = netip.IPv6Unspecified()
	}
	if s.Is4() != d.Is4() {
		s, d = netip.AddrFrom16(s.As16()), netip.AddrFrom16(d.As16())
	}
	return netip.AddrPortFrom(s, h.Source.Port()), netip.AddrPortFrom(d, h.Destination.Port()), true
}

func (h *Header) appendV1(b []byte) ([]byte, error) {
	if len(h.TLVs) > 0 {
		return b, fmt.Errorf("%w: version 1 has no TLVs", ErrInvalidHeader)
	}
	b = append(b, sigV1...)
	src, dst, ok := h.addrs()
	switch {
	case !ok:
		return append(b, "UNKNOWN\r\n"...), nil
	case src.Addr().Is4():
		b = append(b, "TCP4 "...)
	default:
		b = append(b, "TCP6 "...)
	}
	b = src.Addr().AppendTo(b)
	b = append(b, ' ')
	b = dst.Addr().AppendTo(b)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(src.Port()), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(dst.Port()), 10)
	return append(b, "\r\n"...), nil
}

func (h *Header) appendV2(b []byte) ([]byte, error) {
	src, dst, ok := h.addrs()
	fam := uint8(famUnspec)
	switch {
	case !ok:
	case src.Addr().Is4():
		fam = famTCP4
	default:
		fam = famTCP6
	}
	bld := cryptobyte.NewBuilder(b)
	bld.AddBytes(sigV2)
	bld.AddUint8(v2Version<<4 | uint8(h.Command))
	bld.AddUint8(fam)
	bld.AddUint16LengthPrefixed(func(bld *cryptobyte.Builder) {
		if ok {
			bld.AddBytes(src.Addr().AsSlice())
			bld.AddBytes(dst.Addr().AsSlice())
			bld.AddUint16(src.Port())
			bld.AddUint16(dst.Port())
		}
		for _, t := range h.TLVs {
			bld.AddUint8(t.Type)
			bld.AddUint16LengthPrefixed(func(bld *cryptobyte.Builder) { bld.AddBytes(t.Value) })
		}
	})
	out, err := bld.Bytes()
	if err != nil {
		// The only way to fail: a TLV, or the whole, over 65535 bytes.
		return b, fmt.Errorf("%w: too long for a 16-bit length (%v)", ErrInvalidHeader, err)
	}
	return out, nil
}
