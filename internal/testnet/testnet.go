// Package testnet runs small servers on loopback for tests.
package testnet

import (
	"net"
	"testing"
)

// Serve accepts conns on ln until the test ends (it closes ln then), runs
// handle for each in a goroutine of its own and closes the conn after. It
// returns ln's address.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) string {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}
