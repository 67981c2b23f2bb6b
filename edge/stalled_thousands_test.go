//go:build !race

package edge_test

import "testing"

// TestThousandsOfStalledReaders is issue #19's attack at its full size: 16
// addresses, 250 stalled streams each (4,000 in all), against the default
// bound of unread bytes (32 MiB: the windows hold 31 times as much). It
// runs without the race detector, which caps live goroutines at 8128
// (.ci/run runs the tests named Thousand that way).
func TestThousandsOfStalledReaders(t *testing.T) {
	stalledReaders(t, 16, 250, 0)
}
