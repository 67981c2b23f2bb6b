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
//
// # Encrypted ClientHello
//
// With ECH (RFC 9849), the name the client wants travels encrypted, and the
// ServerName of the hello it sends (the outer hello) is only the public name
// of the ECH configuration. A proxy that holds the ECH keys can decrypt the
// inner hello and still leave TLS to a backend: that is ECH's split mode.
// The backend completes the handshake with the inner hello and needs no ECH
// key; any crypto/tls server (Go 1.24 and later) can. NewECHKey makes a key
// and the ECHConfigList to publish; in an edge:
//
//	keys, err := sni.NewECHKeys(echKeys) // once, at start
//	...
//	hello, conn, err := sni.Peek(rawConn)
//	if err != nil { ... } // as above
//	res, err := keys.Decrypt(hello)
//	switch {
//	case err == nil:
//		up := dial(route(res.Inner.ServerName)) // the name the client wants
//		client, backend := res.Wrap(conn, up)   // the inner hello goes to up
//		proxy(client, backend)                  // copies both ways at once
//	case errors.Is(err, sni.ErrNoECH), errors.Is(err, sni.ErrECHNoKey), errors.Is(err, sni.ErrECHDecrypt):
//		// No ECH, GREASE ECH, or a configuration the keys cannot open:
//		// the outer hello, for its public name. A client whose ECH was
//		// rejected expects that server to send it retry configurations.
//		proxy(conn, dial(route(hello.ServerName)))
//	default:
//		conn.Close() // malformed, or an invalid inner hello
//	}
//
// Wrap also handles a HelloRetryRequest from the backend, after which the
// client sends a second hello, encrypted with the same HPKE context: it
// replaces it with its inner hello, decrypted with ECHResult.DecryptRetry.
package sni
