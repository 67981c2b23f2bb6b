package names

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// An identity is printable UTF-8 of 1 to MaxIdentity bytes, with no space.
func TestCheckIdentity(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"alice", "team-a", "ann@example.com", "anonymous-0123456789abcdef01234567", "Zoë", "用户", strings.Repeat("a", MaxIdentity)} {
		if err := CheckIdentity(ok); err != nil {
			t.Errorf("CheckIdentity(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "al ice\n\x00", "al ice", "alice\n", "a\x00", "a\tb", "a\u00a0b", "a\u200bb", "a\u202eb", "\xff", strings.Repeat("a", MaxIdentity+1), strings.Repeat("a", 60000)} {
		if err := CheckIdentity(bad); err == nil {
			t.Errorf("CheckIdentity(%q) = nil, want an error", bad)
		}
	}
}

// A customer's domain is under a public suffix, never one or above one.
func TestReservationPublicSuffix(t *testing.T) {
	t.Parallel()
	const domain = "example.test"
	for _, bad := range []string{"co.uk", "CO.UK.", "github.io", "s3.amazonaws.com"} {
		if res, err := Reservation(bad, "alice", domain, nil); err == nil || !strings.Contains(err.Error(), "public suffix") {
			t.Errorf("Reservation(%q) = %v, %v; want an error saying it is a public suffix", bad, res, err)
		}
	}
	for _, bad := range []string{"co.uk", "github.io", "com", "com.", "uk"} {
		if _, ok := Outside(bad, domain); ok {
			t.Errorf("Outside(%q) = ok, want a public suffix refused as a customer's domain", bad)
		}
	}
	// One label is a name under the domain, "com" as "zzz".
	for req, want := range map[string]string{"shop.co.uk": "shop.co.uk", "Shop.GitHub.io.": "shop.github.io", "example.com": "example.com", "zzz": "zzz.example.test", "ZZZ.example.test.": "zzz.example.test", "com": "com.example.test"} {
		if res, err := Reservation(req, "alice", domain, nil); err != nil || res.Name != want {
			t.Errorf("Reservation(%q) = %v, %v, want %s", req, res, err, want)
		}
	}
}

// FuzzReservationName: the names the operator's API sends (a request's
// path) never panic ReservationName, Reservation, Outside or
// CheckIdentity; a reservation Reservation accepts is stored as
// ReservationName spells its request, which spells it again the same, in
// lower case, without a trailing dot, under the domain or a customer's
// own domain below a public suffix; and its identity passes CheckIdentity.
func FuzzReservationName(f *testing.F) {
	for _, s := range []string{"zzz", "ZZZ", "zzz.example.test", "zzz.example.test.", "co.uk", "shop.co.uk", "*.x", "github.io", "", ".", "a..b", "1.2.3.4", "xn--pple-43d.com", "example.test", "x.example.test.."} {
		f.Add(s, "alice")
	}
	f.Add("zzz", "al ice\n\x00")
	f.Add("zzz", strings.Repeat("é", 200))
	const domain = "example.test"
	f.Fuzz(func(t *testing.T, req, identity string) {
		stored, ok := ReservationName(req, domain)
		if ok {
			if again, ok2 := ReservationName(stored, domain); !ok2 || again != stored || stored != strings.ToLower(stored) || strings.HasSuffix(stored, ".") {
				t.Fatalf("ReservationName(%q) = %q, and again %q, %v", req, stored, again, ok2)
			}
		}
		idErr := CheckIdentity(identity)
		if idErr == nil {
			if len(identity) == 0 || len(identity) > MaxIdentity || !utf8.ValidString(identity) || strings.ContainsFunc(identity, func(r rune) bool { return r == ' ' || !unicode.IsPrint(r) }) {
				t.Fatalf("CheckIdentity(%q) accepted it", identity)
			}
		}
		Outside(req, domain)
		res, err := Reservation(req, identity, domain, nil)
		if err != nil {
			return
		}
		if idErr != nil {
			t.Fatalf("Reservation(%q, %q) accepted an identity CheckIdentity refuses: %v", req, identity, idErr)
		}
		if !ok || res.Name != stored || res.Identity != identity {
			t.Fatalf("Reservation(%q) = %v; ReservationName says %q, %v", req, res, stored, ok)
		}
		if !strings.HasSuffix(res.Name, "."+domain) && PublicSuffix(res.Name) {
			t.Fatalf("Reservation(%q) = %v, a public suffix", req, res)
		}
	})
}
