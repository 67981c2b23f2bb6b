package names

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// Agents send tickets back to the edge, so Signer.open parses
// attacker bytes. The fuzz targets of this file run with, for example,
//
//	go test -run XXX -fuzz '^FuzzTicketOpen$' -fuzztime 2m -parallel 1 ./edge/internal/names/

// fuzzTicketKey is the fixed key the fuzz targets sign with, so that the
// valid tickets among the seeds stay valid.
var fuzzTicketKey = []byte("tunnelkit fuzz ticket key, 32+ bytes long")

// fuzzTickets are tickets as the edge issues them, and ones at the limits
// of the format.
var fuzzTickets = []Ticket{
	{Kind: TicketSession, Issued: time.Unix(1_700_000_000, 0), Identity: "anon-0123456789abcdef01234567", Session: "3f2a9c1e77b051aa"},
	{Kind: TicketEndpoint, Issued: time.Unix(1_700_000_001, 0), Identity: "alice", Proto: "http", Name: "abc.example.test"},
	{Kind: TicketEndpoint, Issued: time.Unix(1_700_000_002, 0), Identity: "bob", Proto: "tls", Name: "*.app.example.test"},
	{Kind: TicketEndpoint, Issued: time.Unix(1_700_000_003, 0), Identity: "bob", Proto: "tcp", Name: "20001"},
	{Issued: time.Unix(0, 0)},
	{Kind: 0xff, Issued: time.Unix(1<<62, 0), Identity: "\x00\xff", Session: "\r\n", Proto: "é", Name: "\x00"},
	{Kind: TicketEndpoint, Issued: time.Unix(1, 0), Identity: strings.Repeat("i", 300), Session: strings.Repeat("s", 255), Proto: strings.Repeat("p", 150)},
}

// sealed returns payload with its MAC under key, base64url as sign writes
// it: a Ticket that is signed right whatever its payload says.
func sealed(key, payload []byte) string {
	return base64.RawURLEncoding.EncodeToString(Signer{Key: key}.mac(bytes.Clone(payload), payload))
}

// FuzzTicketOpen opens arbitrary strings with a fixed key. open must never
// panic, must fail with ErrBadTicket and a zero ticket, and may succeed
// only on a string sign made: signing what it returns must give back the
// same string.
func FuzzTicketOpen(f *testing.F) {
	ts := Signer{Key: fuzzTicketKey}
	for _, tk := range fuzzTickets {
		s, err := ts.Sign(tk)
		if err != nil {
			f.Fatalf("sign(%s): %v", describeTicket(tk), err)
		}
		f.Add(s)
		f.Add(s[:len(s)-1])
		f.Add(s + "A")
		f.Add(s + "==")
		f.Add(base64.URLEncoding.EncodeToString(mustDecode(f, s)))
		f.Add(base64.StdEncoding.EncodeToString(mustDecode(f, s)))
		other, _ := Signer{Key: []byte("another key, of 32 bytes or more")}.Sign(tk)
		f.Add(other)
	}
	// Payloads with a right MAC but a wrong body: only the edge can make
	// these, but open must still refuse them without panicking.
	var b cryptobyte.Builder
	b.AddUint8(ticketVersion)
	b.AddUint8(TicketSession)
	b.AddUint64(1_700_000_000)
	good := b.BytesOrPanic()
	good = append(good, 0, 1, 'a', 0, 0, 0, 0)
	for _, payload := range [][]byte{
		nil,
		{ticketVersion},
		{2, TicketSession, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		append(bytes.Clone(good), 0),
		good[:len(good)-1],
		append(append([]byte{ticketVersion, TicketSession}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), good[10:]...),
		append(append([]byte{ticketVersion, TicketSession}, 0x40, 0, 0, 0, 0, 0, 0, 1), good[10:]...),
		append(append([]byte{ticketVersion, TicketSession}, 0x40, 0, 0, 0, 0, 0, 0, 0), good[10:]...),
		{ticketVersion, TicketSession, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0},
	} {
		f.Add(sealed(fuzzTicketKey, payload))
	}
	for _, s := range []string{
		"",
		"A",
		"AA",
		"AAAA",
		"====",
		"\x00",
		"not a Ticket at all",
		"AQEAAAAAZmZmZgAEYm9iIAA\n",
		strings.Repeat("A", 42),
		strings.Repeat("A", 43),
		strings.Repeat("A", MaxTicket),
		strings.Repeat("A", MaxTicket+1),
		strings.Repeat("_", 100),
		strings.Repeat("-", 100),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tk, err := ts.Open(s)
		if err != nil {
			if !errors.Is(err, ErrBadTicket) || !ticketsEqual(tk, Ticket{}) {
				t.Fatalf("open(%s) = %s, %v; want a zero ticket and ErrBadTicket", clipTicket(s), describeTicket(tk), err)
			}
			return
		}
		if len(s) > MaxTicket || tk.Issued.Nanosecond() != 0 || tk.Issued.Unix() < 0 || tk.Issued.Unix() > 1<<62 {
			t.Fatalf("open(%s) = %s: not a Ticket sign makes", clipTicket(s), describeTicket(tk))
		}
		again, err := ts.Sign(tk)
		if err != nil || again != s {
			t.Fatalf("open(%s) = %s, which signs as %s, %v: open accepted a string sign did not make",
				clipTicket(s), describeTicket(tk), clipTicket(again), err)
		}
	})
}

func mustDecode(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzTicketRoundTrip signs tickets of fuzzed fields (pad adds bytes to
// one field to cross its limit) and opens them. sign must fail exactly when
// a field is over its length prefix or the ticket over MaxTicket; a Ticket
// it signs must open as the same ticket, must not open once any one
// character is replaced, cut or added, and must not open under a key that
// differs in one byte.
func FuzzTicketRoundTrip(f *testing.F) {
	// padding returns a pad argument that adds n bytes to the identity
	// (field 0), the session (1), the proto (2) or the name (3).
	padding := func(field, n int) uint32 { return uint32(n<<2 | field) }
	for i, tk := range fuzzTickets {
		f.Add(tk.Kind, tk.Issued.Unix(), tk.Identity, tk.Session, tk.Proto, tk.Name, uint32(0), uint16(i*7), byte('A'+i), uint8(i), byte(1<<i))
	}
	f.Add(TicketSession, int64(0), "", "", "", "", padding(1, 255), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketSession, int64(0), "", "", "", "", padding(1, 256), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(0), "", "", "", "", padding(2, 255), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(0), "", "", "", "", padding(2, 256), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(0), "", "", "", "", padding(3, 720), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(0), "", "", "", "", padding(3, 721), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(0), "", "", "", "", padding(3, 0xffff), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(0), "", "", "", "", padding(0, 0x10000), uint16(0), byte(0), uint8(0), byte(0))
	f.Add(TicketEndpoint, int64(-1), "a", "", "", "", uint32(0), uint16(0xffff), byte(0xff), uint8(0xff), byte(0xff))
	f.Fuzz(func(t *testing.T, kind uint8, issued int64, identity, session, proto, name string,
		pad uint32, pos uint16, c byte, keyPos uint8, keyXor byte) {
		n := int(pad>>2) % 0x10100
		switch pad & 3 {
		case 0:
			identity += strings.Repeat("i", n)
		case 1:
			session += strings.Repeat("s", n)
		case 2:
			proto += strings.Repeat("p", n)
		case 3:
			name += strings.Repeat("n", n)
		}
		// open takes only the seconds from 1970 to 2^62 (time.Now is
		// within them); sign takes any time, so the round trip stays in
		// open's range.
		secs := int64(uint64(issued) % (1<<62 + 1))
		tk := Ticket{Kind: kind, Issued: time.Unix(secs, 0), Identity: identity, Session: session, Proto: proto, Name: name}

		key := bytes.Clone(fuzzTicketKey)
		ts := Signer{Key: key}
		s, err := ts.Sign(tk)
		raw := 16 + len(identity) + len(session) + len(proto) + len(name) + 32
		size := (raw*4 + 2) / 3 // unpadded base64
		if len(identity) > 0xffff || len(session) > 0xff || len(proto) > 0xff || len(name) > 0xffff || size > MaxTicket {
			if err == nil || s != "" {
				t.Fatalf("sign of a %d-byte ticket (identity %d, session %d, proto %d, name %d) = %d bytes, %v; want an error",
					size, len(identity), len(session), len(proto), len(name), len(s), err)
			}
			return
		}
		if err != nil || len(s) != size {
			t.Fatalf("sign(%s) = %d bytes, %v; want %d", describeTicket(tk), len(s), err, size)
		}
		got, err := ts.Open(s)
		if err != nil || !ticketsEqual(got, tk) {
			t.Fatalf("signed %s as %s, opened %s, %v", describeTicket(tk), clipTicket(s), describeTicket(got), err)
		}

		// One character replaced, cut or added.
		p := int(pos) % len(s)
		b := []byte(s)
		b[p] = c
		if c == s[p] {
			b[p] ^= 1
		}
		for _, tampered := range []string{string(b), s[:len(s)-1], s[1:], s + string(rune(c)), s[:p] + s[p+1:]} {
			if got, err := ts.Open(tampered); err == nil {
				t.Fatalf("signed %s as %s; %s opened too, as %s", describeTicket(tk), clipTicket(s), clipTicket(tampered), describeTicket(got))
			}
		}

		// A key that differs in one byte.
		other := bytes.Clone(key)
		other[int(keyPos)%len(other)] ^= max(keyXor, 1)
		if got, err := (Signer{Key: other}).Open(s); err == nil {
			t.Fatalf("signed %s under %q; opened under %q as %s", describeTicket(tk), key, other, describeTicket(got))
		}
		if s2, err := (Signer{Key: other}).Sign(tk); err != nil || s2 == s {
			t.Fatalf("signed %s as %s under two keys: %s, %v", describeTicket(tk), clipTicket(s), clipTicket(s2), err)
		}
	})
}

// TestTicketTamperedFails replaces each character of valid tickets, of
// each length modulo 3 of their bytes, with each other byte value, and
// inserts a CR or LF at each place: no result may open.
func TestTicketTamperedFails(t *testing.T) {
	t.Parallel()
	ts := Signer{Key: fuzzTicketKey}
	for _, identity := range []string{"a", "ab", "abc"} {
		tk := Ticket{Kind: TicketEndpoint, Issued: time.Unix(1_700_000_000, 0), Identity: identity, Proto: "http", Name: "abc"}
		s, err := ts.Sign(tk)
		if err != nil {
			t.Fatal(err)
		}
		var opened []string
		for p := range len(s) {
			for c := range 256 {
				if byte(c) != s[p] {
					b := []byte(s)
					b[p] = byte(c)
					opened = appendIfOpens(opened, ts, string(b))
				}
			}
		}
		for p := range len(s) + 1 {
			opened = appendIfOpens(opened, ts, s[:p]+"\n"+s[p:])
			opened = appendIfOpens(opened, ts, s[:p]+"\r"+s[p:])
		}
		if len(opened) > 0 {
			t.Errorf("ticket %q (%d bytes): %d strings with one character changed or inserted open too, as %q",
				s, len(mustDecode(t, s)), len(opened), opened[:min(len(opened), 3)])
		}
	}
}

// appendIfOpens appends s to opened if ts opens it.
func appendIfOpens(opened []string, ts Signer, s string) []string {
	if _, err := ts.Open(s); err == nil {
		opened = append(opened, s)
	}
	return opened
}

func ticketsEqual(a, b Ticket) bool {
	return a.Kind == b.Kind && a.Issued.Equal(b.Issued) && a.Identity == b.Identity &&
		a.Session == b.Session && a.Proto == b.Proto && a.Name == b.Name
}

// describeTicket formats a Ticket for a failure message.
func describeTicket(t Ticket) string {
	return fmt.Sprintf("{kind %d issued %d identity %s session %s proto %s name %s}", t.Kind, t.Issued.Unix(),
		clipTicket(t.Identity), clipTicket(t.Session), clipTicket(t.Proto), clipTicket(t.Name))
}

// clipTicket quotes a Ticket string for a failure message, cut to its
// first 200 bytes.
func clipTicket(s string) string {
	if len(s) > 200 {
		return fmt.Sprintf("%q... (%d bytes)", s[:200], len(s))
	}
	return fmt.Sprintf("%q", s)
}
