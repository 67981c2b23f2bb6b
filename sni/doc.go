// Package sni reads the server name (SNI) and ALPN list of a TLS ClientHello
// without consuming it, so a proxy can route a TLS connection by name and
// hand it on, every byte intact, to a backend or to a crypto/tls server.
//
// Typical use, in an edge that routes TLS by name:
//
//	hello, conn, err := sni.Peek(rawConn) // conn replays every byte Peek read
//	switch {
//	case errors.Is(err, sni.ErrNotTLS):
//		serveCleartext(conn) // decided on the first byte, without waiting
//	case err != nil:
//		conn.Close() // malformed, too large, timed out, closed early...
//	default:
//		backend := route(hello.ServerName) // "example.com" for "Example.COM."
//		proxy(conn, backend)               // io.Copy keeps the splice path
//	}
//
// A Peeker sets the limits: by default Peek waits at most 10 seconds and
// reads at most 16 KiB. Peek reads with ordinary blocking reads under a read
// deadline and decides after each one, so it returns as soon as the bytes
// decide the outcome: it never polls, and a client that does not speak TLS is
// recognised on its first byte. A ClientHello split over TCP segments or over
// TLS records (of any size, down to one byte) is reassembled.
//
// Parse does the same for bytes a caller already holds.
//
// A name that is not a valid host name, two names, or a hello that is
// malformed, too large, cut short or late are errors, never an empty name: an
// empty ServerName means only that the client sent no name.
package sni
