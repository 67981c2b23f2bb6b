package names

import (
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
	"golang.org/x/net/idna"
)

// The names agents may bind.

// Check returns the normalised pattern an agent asked to bind, req: one
// label under domain ("abc"), or a name or wildcard under it. Labels are
// a-z, 0-9 and '-'; an "xn--" label must be valid IDNA in one script; "*"
// and "*.<domain>" (every name under it) need catchAll.
func Check(req, domain string, catchAll bool) (string, error) {
	name := strings.ToLower(strings.TrimSuffix(req, "."))
	if !strings.Contains(name, ".") {
		name += "." + domain
	}
	name, ok := router.NormalisePattern(name)
	if !ok || len(name) > 253 {
		return "", errors.New("invalid name: want DNS labels of a-z, 0-9 and '-'")
	}
	if !strings.HasSuffix(name, "."+domain) {
		return "", fmt.Errorf("invalid name: want a name under %s", domain)
	}
	if name == "*."+domain && !catchAll {
		return "", fmt.Errorf("invalid name: this edge does not hand out %s (every name under its domain)", name)
	}
	if rest := strings.TrimPrefix(name, "*."); rest != domain {
		for l := range strings.SplitSeq(strings.TrimSuffix(rest, "."+domain), ".") {
			if err := checkLabel(l); err != nil {
				return "", err
			}
		}
	}
	return name, nil
}

// checkLabel checks one label of a name to bind: 1 to 63 of a-z, 0-9 and
// '-', not starting or ending with '-'; "--" in the third and fourth place
// only for an "xn--" label (RFC 5891 reserves the others), which must be
// IDNA punycode that decodes to letters, marks and digits of one script
// (so "xn--pple-43d", a Cyrillic "а" before Latin "pple", is refused).
func checkLabel(l string) error {
	if !validLabel(l) {
		return errors.New("invalid name: want DNS labels of a-z, 0-9 and '-'")
	}
	if len(l) < 4 || l[2:4] != "--" {
		return nil
	}
	if !strings.HasPrefix(l, "xn--") {
		return fmt.Errorf("invalid name: label %q: '--' in the third and fourth place is reserved", l)
	}
	u, err := idna.Registration.ToUnicode(l)
	if err == nil {
		var back string
		if back, err = idna.Registration.ToASCII(u); err == nil && back != l {
			err = errors.New("does not round-trip")
		}
	}
	if err != nil {
		return fmt.Errorf("invalid name: label %q is not valid IDNA: %v", l, err)
	}
	if !oneScript(u) {
		return fmt.Errorf("invalid name: label %q (%s) mixes scripts or has symbols", l, wire.Printable(u, 64))
	}
	return nil
}

// oneScript reports whether every rune of a decoded label is a letter,
// mark, digit or '-', and its letters come from one script.
func oneScript(u string) bool {
	var script *unicode.RangeTable
	for _, r := range u {
		switch {
		case r == '-' || unicode.IsDigit(r) || unicode.IsMark(r):
			continue
		case !unicode.IsLetter(r):
			return false
		}
		if script != nil && unicode.Is(script, r) {
			continue
		}
		if script != nil {
			return false
		}
		for _, t := range unicode.Scripts {
			if unicode.Is(t, r) {
				script = t
				break
			}
		}
		if script == nil {
			return false
		}
	}
	return true
}

// validLabel reports whether s is one DNS label: 1 to 63 of a-z, 0-9 and
// '-', not starting or ending with '-'.
func validLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Random returns a random label: 10 characters of a-z and 0-9.
func Random() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 10)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
