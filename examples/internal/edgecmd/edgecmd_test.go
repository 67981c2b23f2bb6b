package edgecmd

import (
	"context"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// -proxy-protocol-from takes CIDR prefixes and single addresses, comma
// separated and repeated.
func TestProxyProtocolFromFlag(t *testing.T) {
	var l prefixList
	for _, v := range []string{"10.0.0.0/8, 192.0.2.7", "2001:db8::/32"} {
		if err := l.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("2001:db8::/32"),
	}
	if !slices.Equal(l, want) {
		t.Fatalf("prefixes %v, want %v", l, want)
	}
	if got := l.String(); got != "10.0.0.0/8,192.0.2.7/32,2001:db8::/32" {
		t.Errorf("String() = %q", got)
	}
}

// A bad prefix stops the command before it listens, saying which flag and
// which value.
func TestProxyProtocolFromBadPrefix(t *testing.T) {
	for _, bad := range []string{"10.0.0.0/33", "10.0.0.0/8,lb.example.com", "10.0.0.0/8,"} {
		var stderr strings.Builder
		err := Run(context.Background(), "edge", []string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0", "-proxy-protocol-from", bad}, io.Discard, &stderr, nil)
		if err == nil || !strings.Contains(err.Error(), "-proxy-protocol-from") || !strings.Contains(err.Error(), "not a CIDR prefix") {
			t.Errorf("-proxy-protocol-from %q: %v, want an error naming the flag and the bad value", bad, err)
		}
	}
}
