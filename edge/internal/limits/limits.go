// Package limits keeps an edge's books per client source, against
// strangers: the agent connections waiting for their hello (Pending), the
// failed authentications of each source (AuthGuard) and the log lines
// strangers cause (LogBudget), the connections and TLS handshakes of each
// public client source (Count, Listener), a public client's share of an
// endpoint (Shares), and the quotas of endpoints by identity, source and
// edge (Quotas). Each type owns its lock; none knows of sessions or routes.
package limits

import (
	"net"
	"net/netip"
)

// Source returns the key a client's address is counted by: the address
// for IPv4, its /64 for IPv6 (one host's share of a network). It is the
// invalid prefix for an invalid address (a conn over a pipe or a Unix
// socket).
func Source(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// maxTrackedSources bounds the sources a table keeps.
const maxTrackedSources = 1 << 16

// SourceOf returns the Source of the address of a conn's peer.
func SourceOf(a net.Addr) netip.Prefix {
	if ta, ok := a.(*net.TCPAddr); ok {
		return Source(ta.AddrPort().Addr())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return Source(ap.Addr())
}
