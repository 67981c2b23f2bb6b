// Package proxyproto reads and writes the header of the HAProxy PROXY
// protocol, versions 1 (text) and 2 (binary), which a proxy sends as the
// first bytes of a TCP connection to tell the server the addresses of the
// client it relays.
//
// The agent writes one to a local upstream before forwarding a connection, so
// that the upstream sees the real client:
//
//	upstream, err := net.Dial("tcp", "127.0.0.1:8080")
//	...
//	// In one Write, before any other byte. src is the client's address
//	// (the zero netip.AddrPort if unknown), dst the one it connected to.
//	if err := proxyproto.Write(upstream, 2, src, dst); err != nil {
//		...
//	}
//	proxy(client, upstream)
//
// The edge, behind a load balancer that sends it, reads it with a Listener,
// whose conns report the header's source as their RemoteAddr:
//
//	ln := &proxyproto.Listener{
//		Listener: inner,    // the public listener, owned by ln from now on
//		Required: true,     // close conns without a valid header
//		Trusted:  proxyproto.TrustPrefixes(netip.MustParsePrefix("10.0.0.0/8")),
//	}
//	defer ln.Close()
//	for {
//		conn, err := ln.Accept() // conn.RemoteAddr() is the real client
//		...
//	}
//
// A listener that clients reach both through the proxies and directly
// passes the others' conns through with their own addresses, never reading
// a header from them; for protocols whose clients speak first (HTTP, TLS),
// it can also close those that start with a PROXY signature, a client
// trying to choose its address:
//
//	ln := &proxyproto.Listener{
//		Listener:               inner,
//		Required:               true, // from the proxies
//		Trusted:                proxyproto.TrustPrefixes(netip.MustParsePrefix("10.0.0.0/8")),
//		PassUntrusted:          true, // everyone else is a direct client
//		RejectUntrustedHeaders: true, // who must not send a header
//	}
//
// Read parses a header from a *bufio.Reader and leaves every byte after it
// there; it tells a stream that carries no header on its first byte
// (ErrNoProxyHeader), without waiting for more.
//
// The spec is https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt.
// This package supports TCP over IPv4 and IPv6. It reads, but reports no
// addresses for, the version 2 families AF_UNSPEC and AF_UNIX; it rejects
// UDP (a datagram transport on a stream). TLVs are read and written raw.
package proxyproto
