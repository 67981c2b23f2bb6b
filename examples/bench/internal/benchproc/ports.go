//go:build unix

package benchproc

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
)

// FreePorts returns n consecutive loopback ports that are free now, below
// the kernel's ephemeral range so that no client conn takes one
// meanwhile. Another process may still take one before it is listened
// on.
func FreePorts(n int) ([]int, error) {
	for range 100 {
		base := 10000 + rand.IntN(20000)
		var lns []net.Listener
		ok := true
		for p := base; p < base+n; p++ {
			ln, err := net.Listen("tcp", Loopback(p))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if ok {
			ports := make([]int, n)
			for i := range ports {
				ports[i] = base + i
			}
			return ports, nil
		}
	}
	return nil, errors.New("no free loopback port range")
}

// Loopback returns 127.0.0.1:port.
func Loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
