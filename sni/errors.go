package sni

import (
	"errors"
	"net"
	"os"
)

// The errors of this package. Errors returned by Parse and Peek wrap one of
// them (check with errors.Is), or wrap io.EOF, io.ErrUnexpectedEOF or the
// conn's own read error, as Peek documents. The ECH functions document
// theirs.
var (
	// ErrNotTLS means the first byte is not 0x16, the TLS handshake record
	// type, so the peer is not starting a TLS handshake: plain text
	// (HTTP, SSH, PROXY protocol), an SSLv2-style hello (first byte 0x80), a
	// TLS alert, and so on. Peek decides it on the first byte, at once.
	ErrNotTLS = errors.New("sni: not a TLS handshake")

	// ErrMalformed means the bytes begin like a TLS handshake (first byte
	// 0x16) but do not carry a well-formed ClientHello: a bad record header, a
	// non-handshake record after the first one, a handshake message other than
	// ClientHello, a truncated or inconsistent field, two host_name entries, a
	// repeated extension that this package reads.
	ErrMalformed = errors.New("sni: malformed ClientHello")

	// ErrTooLarge means a TLS record announces a length above 2^14 (the TLS
	// limit), or the ClientHello does not fit in Peeker.MaxBytes. Lengths are
	// checked on their headers, before the bytes they announce are read or
	// any memory is set aside for them.
	ErrTooLarge = errors.New("sni: ClientHello too large")

	// ErrInvalidName means the server_name extension carries a host name that
	// is not a valid DNS host name, or is an IP address literal, which RFC
	// 6066 forbids in SNI. See ClientHello.ServerName for the rules.
	ErrInvalidName = errors.New("sni: server name is not a valid host name")

	// ErrIncomplete is returned by Parse when its input is a valid but
	// incomplete beginning of a ClientHello: more bytes could complete it.
	// Peek never returns it: it reads more, and reports the end of the
	// stream, a timeout or ErrTooLarge instead.
	ErrIncomplete = errors.New("sni: incomplete ClientHello")

	// ErrNoECH is returned by ECHKeys.Decrypt and ClientHello.ECHExtension
	// when the hello carries no encrypted_client_hello extension, and by
	// Decrypt also when it carries an inner one: there is nothing to
	// decrypt, and the hello's ServerName is the name to route by.
	ErrNoECH = errors.New("sni: no encrypted_client_hello extension")

	// ErrECHNoKey is returned by ECHKeys.Decrypt when no key has the
	// config_id of the hello's outer ECH extension and offers its cipher
	// suite. This is what GREASE ECH (a fake extension, sent by browsers to
	// servers that published no ECH keys) gives, as does a client with a
	// stale or foreign ECH configuration. ECH is then rejected: the hello is
	// served as the outer hello, whose ServerName is the public name.
	ErrECHNoKey = errors.New("sni: no ECH key for the hello's config_id")

	// ErrECHDecrypt means a key had the hello's config_id and cipher suite,
	// but the encrypted ClientHello did not decrypt with it: a GREASE
	// extension whose random config_id happens to match (1 in 256), a
	// stale key that reused a config_id, or a hello altered on the way.
	// For Decrypt, ECH is then rejected, as for ErrECHNoKey. For
	// DecryptRetry, the connection must be aborted.
	ErrECHDecrypt = errors.New("sni: ECH decryption failed")

	// ErrTimeout is returned by Peek when the read deadline passes before a
	// complete ClientHello arrives. It is a net.Error whose Timeout method
	// reports true, and errors.Is(ErrTimeout, os.ErrDeadlineExceeded) holds.
	ErrTimeout net.Error = timeoutError{}
)

// timeoutError is the type of ErrTimeout.
type timeoutError struct{}

func (timeoutError) Error() string   { return "sni: timed out waiting for the ClientHello" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// Is makes errors.Is(ErrTimeout, os.ErrDeadlineExceeded) hold, as it does for
// the read errors of a net.Conn whose deadline passed.
func (timeoutError) Is(target error) bool { return target == os.ErrDeadlineExceeded }
