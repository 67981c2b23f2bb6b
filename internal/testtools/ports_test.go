package testtools

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePort: the ports are free, distinct, and below the kernel's
// ephemeral range where it has room.
func TestFreePort(t *testing.T) {
	lo, hi := belowEphemeral()
	seen := map[int]bool{}
	for range 50 {
		p, err := FreePort(true)
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d returned twice", p)
		}
		seen[p] = true
		if hi > lo && (p < lo || p > hi) {
			t.Fatalf("port %d outside %d-%d", p, lo, hi)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		ln.Close()
	}
}
