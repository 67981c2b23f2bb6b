package testtools

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// handedOut are the ports FreePort returned, which it does not return
// again.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// FreePort returns a loopback port free for TCP now (and for UDP, when
// udp is set), for a test to give a process it starts. A port the kernel
// picks (":0") is one of its ephemeral range, from which every outgoing
// connection takes its source port: on a busy machine, one may take it
// before the process listens on it ("address already in use"). So on
// Linux the port is chosen below that range (ip_local_port_range), where
// no outgoing connection goes, and not one this process returned before;
// elsewhere, or when the range leaves no room below it, the kernel picks.
func FreePort(udp bool) (int, error) {
	lo, hi := belowEphemeral()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		p := 0
		if hi > lo {
			p = lo + rand.IntN(hi-lo+1)
		}
		port, err := tryPort(p, udp)
		if err != nil {
			if p == 0 {
				return 0, err
			}
			continue // taken: another
		}
		if handedOut.ports[port] {
			continue // the kernel's pick, too, may be one returned before
		}
		if handedOut.ports == nil {
			handedOut.ports = map[int]bool{}
		}
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, errors.New("testtools: no free port found")
}

// tryPort listens on 127.0.0.1:p for TCP (and UDP when udp is set), and
// returns the port, having closed what it opened.
func tryPort(p int, udp bool) (int, error) {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if udp {
		pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return 0, err
		}
		pc.Close()
	}
	return port, nil
}

// belowEphemeral returns the ports FreePort chooses from: 10000 up to the
// kernel's ephemeral range; 0, 0 when it cannot tell, or when that leaves
// fewer than 10,000.
func belowEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first-1 < 20000 {
		return 0, 0
	}
	return 10000, first - 1
}
