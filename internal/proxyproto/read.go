package proxyproto

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/cryptobyte"
)

// Read reads a PROXY protocol header, version 1 or 2, from the start of r and
// returns it. It consumes exactly the header: every byte after it is left in
// r, read or not yet read from the underlying reader. It tells the versions
// apart on the first byte, and reads no more than the header needs: 107
// bytes at most for version 1, and for version 2 the 16-byte fixed part and
// the length it announces (at most 65535 bytes, allocated as they arrive).
//
// Read sets no deadline: to bound the time it takes, set a read deadline on
// the conn under r, as Listener does.
//
// A nil error comes with a non-nil Header; an error, with a nil one. The
// errors, checked with errors.Is:
//   - ErrNoProxyHeader: the stream does not start with a PROXY signature,
//     decided on the first byte that differs from both; Read then consumed
//     nothing.
//   - ErrMalformed: a signature, then an invalid header.
//   - ErrTimeout (a net.Error whose Timeout method reports true, which also
//     matches os.ErrDeadlineExceeded): the reader returned a timeout.
//   - io.EOF: the stream ended before its first byte.
//   - io.ErrUnexpectedEOF: the stream ended inside a header, or inside a
//     signature (which then decides nothing, so Read consumed nothing).
//
// Other read errors are returned wrapped. On errors other than
// ErrNoProxyHeader, r may have been read from: the stream is of no more use,
// unless the error came before the signature was complete.
func Read(r *bufio.Reader) (*Header, error) {
	version, err := detect(r)
	if err != nil {
		return nil, err
	}
	return readVersion(r, version)
}

// readVersion reads the header that detect found, signature included.
func readVersion(r *bufio.Reader, version int) (*Header, error) {
	if version == 1 {
		return readV1(r)
	}
	return readV2(r)
}

// detect peeks at the start of r until it holds a whole signature, and
// returns its version, or an error as soon as the bytes differ from both.
// It consumes nothing. Each peek waits for one byte more than r holds,
// so it never waits for a byte that is not needed.
func detect(r *bufio.Reader) (version int, err error) {
	for need := 1; ; {
		b, err := r.Peek(need)
		if len(b) < need {
			return 0, readError(err, len(b))
		}
		b, _ = r.Peek(min(r.Buffered(), len(sigV2))) // all there is, without waiting
		switch {
		case bytes.HasPrefix(sigV1, b[:min(len(b), len(sigV1))]):
			if len(b) >= len(sigV1) {
				return 1, nil
			}
		case bytes.HasPrefix(sigV2, b):
			if len(b) == len(sigV2) {
				return 2, nil
			}
		default:
			return 0, ErrNoProxyHeader
		}
		need = len(b) + 1
	}
}

// readError turns the error of a read that left a header incomplete, after
// n bytes of it, into Read's error.
func readError(err error, n int) error {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	case errors.Is(err, io.EOF) && n == 0:
		return fmt.Errorf("proxyproto: connection closed before any byte: %w", io.EOF)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("proxyproto: connection closed after %d bytes, inside the PROXY header: %w", n, io.ErrUnexpectedEOF)
	case err == nil: // a reader that returned no bytes and no error
		err = io.ErrNoProgress
	}
	return fmt.Errorf("proxyproto: reading the PROXY header: %w", err)
}

// malformed returns an ErrMalformed with details.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// readV1 reads a version 1 header: one line of at most 107 bytes, CRLF
// included, byte by byte so that it never consumes a byte past the LF.
func readV1(r *bufio.Reader) (*Header, error) {
	var buf [maxV1Len]byte
	line := buf[:0]
	for len(line) == 0 || line[len(line)-1] != '\n' {
		if len(line) == maxV1Len {
			return nil, malformed("version 1: no CRLF within %d bytes", maxV1Len)
		}
		c, err := r.ReadByte()
		if err != nil {
			return nil, readError(err, len(line))
		}
		line = append(line, c)
	}
	text, ok := strings.CutSuffix(string(line), "\r\n")
	if !ok {
		return nil, malformed("version 1: line ends with LF without CR")
	}
	fields := strings.Split(text, " ")
	switch {
	case fields[0] != "PROXY" || len(fields) < 2: // not after detect; for safety
		return nil, malformed("version 1: no PROXY signature")
	case fields[1] == "UNKNOWN":
		// The spec: the receiver ignores whatever follows, up to CRLF.
		return &Header{Version: 1, Command: Local}, nil
	case fields[1] != "TCP4" && fields[1] != "TCP6":
		return nil, malformed("version 1: protocol %q, want TCP4, TCP6 or UNKNOWN", fields[1])
	case len(fields) != 6:
		return nil, malformed("version 1: %d fields, want 6, separated by single spaces", len(fields))
	}
	is4 := fields[1] == "TCP4"
	src, err1 := parseAddrV1(fields[2], is4)
	dst, err2 := parseAddrV1(fields[3], is4)
	sport, err3 := parsePortV1(fields[4])
	dport, err4 := parsePortV1(fields[5])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, malformed("version 1: %v", err)
	}
	return &Header{
		Version:     1,
		Command:     Proxy,
		Source:      netip.AddrPortFrom(src, sport),
		Destination: netip.AddrPortFrom(dst, dport),
	}, nil
}

// parseAddrV1 parses an address of a TCP4 (is4) or TCP6 line, and returns it
// unmapped.
func parseAddrV1(s string, is4 bool) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return a, fmt.Errorf("invalid address %q", s)
	case is4 && !a.Is4():
		return a, fmt.Errorf("address %q is not IPv4, in a TCP4 header", s)
	case !is4 && !a.Is6():
		return a, fmt.Errorf("address %q is not IPv6, in a TCP6 header", s)
	case a.Zone() != "":
		return a, fmt.Errorf("address %q has a zone", s)
	}
	return a.Unmap(), nil
}

// parsePortV1 parses a port: 0 to 65535 in decimal digits, without sign,
// spaces or leading zeros.
func parsePortV1(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16) // rejects signs, spaces, empty
	if err != nil || len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("invalid port %q", s)
	}
	return uint16(n), nil
}

// readV2 reads a version 2 header: the 16-byte fixed part, then the length
// it announces.
func readV2(r *bufio.Reader) (*Header, error) {
	var fixed [16]byte
	if n, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, readError(err, n)
	}
	var verCmd, fam uint8
	var length uint16
	s := cryptobyte.String(fixed[:])
	if !s.Skip(len(sigV2)) || !s.ReadUint8(&verCmd) || !s.ReadUint8(&fam) || !s.ReadUint16(&length) {
		panic("proxyproto: fixed part of the wrong size")
	}
	if v := verCmd >> 4; v != v2Version {
		return nil, malformed("version 2: version nibble %#x, want 0x2", v)
	}
	cmd := Command(verCmd & 0x0f)
	if cmd != Local && cmd != Proxy {
		return nil, malformed("version 2: unknown command %#x", uint8(cmd))
	}
	var ipLen, addrLen int // of each IP address, and of the address block
	switch fam {
	case famUnspec:
	case famTCP4, famUDP4:
		ipLen = net.IPv4len
	case famTCP6, famUDP6:
		ipLen = net.IPv6len
	case famUnixStream, famUnixDgram:
		addrLen = addrLenUnix
	default:
		return nil, malformed("version 2: unknown family and transport %#02x", fam)
	}
	if ipLen > 0 {
		addrLen = 2*ipLen + 2*2 // source and destination addresses, then ports
	}
	if cmd == Proxy && fam&0x0f == transportDgram {
		return nil, malformed("version 2: a datagram (UDP) header, on a stream")
	}
	if int(length) < addrLen {
		return nil, malformed("version 2: length %d, shorter than the %d bytes of family %#02x's addresses", length, addrLen, fam)
	}

	body, err := readBody(r, int(length))
	if err != nil {
		return nil, readError(err, len(fixed)+len(body))
	}
	s = cryptobyte.String(body)
	h := &Header{Version: 2, Command: cmd}
	if ipLen > 0 {
		var src, dst []byte
		var sport, dport uint16
		if !s.ReadBytes(&src, ipLen) || !s.ReadBytes(&dst, ipLen) || !s.ReadUint16(&sport) || !s.ReadUint16(&dport) {
			panic("proxyproto: address block shorter than checked")
		}
		if cmd == Proxy { // for LOCAL, the spec says to discard them
			sa, _ := netip.AddrFromSlice(src)
			da, _ := netip.AddrFromSlice(dst)
			h.Source = netip.AddrPortFrom(sa.Unmap(), sport)
			h.Destination = netip.AddrPortFrom(da.Unmap(), dport)
		}
	} else if !s.Skip(addrLen) { // AF_UNIX or AF_UNSPEC: no IP addresses
		panic("proxyproto: address block shorter than checked")
	}
	for !s.Empty() {
		var t TLV
		var v cryptobyte.String
		if !s.ReadUint8(&t.Type) || !s.ReadUint16LengthPrefixed(&v) {
			return nil, malformed("version 2: truncated TLV after %d whole ones", len(h.TLVs))
		}
		t.Value = v
		h.TLVs = append(h.TLVs, t)
	}
	return h, nil
}

// readBody reads n bytes from r into a slice that grows as they arrive, so
// that a peer announcing 64 KiB and sending little costs little memory.
func readBody(r io.Reader, n int) ([]byte, error) {
	const first = 512
	b := make([]byte, 0, min(n, first))
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n-len(b), len(b))) // at most doubles
		}
		m, err := io.ReadFull(r, b[len(b):min(n, cap(b))])
		b = b[:len(b)+m]
		if err != nil {
			return b, err
		}
	}
	return b, nil
}
