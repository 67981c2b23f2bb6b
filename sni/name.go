package sni

import "fmt"

// Limits on host names, RFC 1035 section 2.3.4.
const (
	maxNameLen  = 253 // without the trailing dot
	maxLabelLen = 63
)

// checkHostName checks a host_name as sent. It returns the length of the
// name without its one optional trailing dot, and whether the name has upper
// case letters, which is all normalising needs. An absent name (nil or empty)
// is valid and gives 0.
//
// The rules are those documented on ClientHello.ServerName: labels of 1 to 63
// bytes of ASCII letters, digits, '-' and '_', separated by single dots, at
// most 253 bytes in all, and a last label that is not all digits (an IPv4
// literal, in any of the forms that inet_aton accepts; RFC 6066 forbids IP
// literals in SNI, and RFC 3696 rules out all-numeric top-level domains).
// Underscores and hyphens at either end of a label are allowed: they occur in
// real names and do not affect routing.
func checkHostName(raw []byte) (n int, upper bool, err error) {
	if len(raw) == 0 {
		return 0, false, nil
	}
	name := raw
	if name[len(name)-1] == '.' {
		name = name[:len(name)-1] // one trailing dot: a fully qualified name
	}
	invalid := func(why string) (int, bool, error) {
		return 0, false, fmt.Errorf("%w: %.80q: %s", ErrInvalidName, raw, why)
	}
	if len(name) == 0 {
		return invalid("empty")
	}
	if len(name) > maxNameLen {
		return invalid("longer than 253 bytes")
	}
	label, digits := 0, true // length of the current label; all digits so far?
	for _, c := range name {
		switch {
		case c == '.':
			if label == 0 {
				return invalid("empty label")
			}
			label, digits = 0, true
			continue
		case 'a' <= c && c <= 'z', c == '-', c == '_':
			digits = false
		case 'A' <= c && c <= 'Z':
			digits, upper = false, true
		case '0' <= c && c <= '9':
		default:
			return invalid(fmt.Sprintf("byte %q not allowed", c))
		}
		label++
		if label > maxLabelLen {
			return invalid("label longer than 63 bytes")
		}
	}
	if label == 0 {
		return invalid("empty label")
	}
	if digits {
		return invalid("an IP address, or a last label of digits")
	}
	return len(name), upper, nil
}
