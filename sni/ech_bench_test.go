package sni

import (
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"
)

// BenchmarkECH measures, in one run, what ECH split mode costs an edge per
// connection beside what a TLS 1.3 handshake costs its two ends:
//
//   - decrypt: ECHKeys.Decrypt of a Go client's hello (HPKE open, inner
//     hello rebuilt, parsed and framed), keys prepared once;
//   - decrypt-unprepared: DecryptECH, which prepares the key each call;
//   - handshake: a full TLS 1.3 handshake between a crypto/tls client and
//     server over net.Pipe, Go's defaults (X25519MLKEM768, an ECDSA P-256
//     certificate), both ends in this process; it also reports decrypt's
//     cost as a percentage of it (decrypt-%);
//   - split-handshake: the same handshake with ECH, through an edge that
//     peeks, decrypts and relays with Wrap to a keyless backend.
func BenchmarkECH(b *testing.B) {
	h := getHeldKey(b)
	hello, err := Parse(captureHello(b, echClient(b, h.list)))
	if err != nil {
		b.Fatal(err)
	}
	var decryptNs float64
	b.Run("decrypt", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.keys.Decrypt(hello); err != nil {
				b.Fatal(err)
			}
		}
		decryptNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("decrypt-unprepared", func(b *testing.B) {
		b.ReportAllocs()
		keys := []tls.EncryptedClientHelloKey{h.key}
		for b.Loop() {
			if _, err := DecryptECH(hello, keys); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("handshake", func(b *testing.B) {
		b.ReportAllocs()
		client := clientConfig(b, appName)
		server := &tls.Config{Certificates: []tls.Certificate{getPKI(b).cert}}
		for b.Loop() {
			benchHandshake(b, client, server)
		}
		if decryptNs > 0 {
			b.ReportMetric(100*decryptNs/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "decrypt-%")
		}
	})
	b.Run("split-handshake", func(b *testing.B) {
		b.ReportAllocs()
		client := echClient(b, h.list)
		backend := backendConfig(b)
		for b.Loop() {
			benchSplitHandshake(b, client, backend, h.keys)
		}
	})
}

// benchHandshake runs one TLS handshake over net.Pipe.
func benchHandshake(b *testing.B, client, server *tls.Config) {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	var wg sync.WaitGroup
	var serr error
	wg.Go(func() { serr = tls.Server(s, server).Handshake() })
	cerr := tls.Client(c, client).Handshake()
	wg.Wait()
	if cerr != nil || serr != nil {
		b.Fatal(cerr, serr)
	}
}

// benchSplitHandshake runs one ECH handshake through an edge in split mode,
// over net.Pipes.
func benchSplitHandshake(b *testing.B, client, backend *tls.Config, keys *ECHKeys) {
	clientSide, edgeIn := net.Pipe()
	edgeOut, backendSide := net.Pipe()
	var wg sync.WaitGroup
	var berr, eerr error
	wg.Go(func() {
		defer backendSide.Close()
		berr = tls.Server(backendSide, backend).Handshake()
	})
	wg.Go(func() {
		hello, conn, err := (&Peeker{Timeout: 10 * time.Second}).Peek(edgeIn)
		var res *ECHResult
		if err == nil {
			res, err = keys.Decrypt(hello)
		}
		if err != nil {
			eerr = err
			conn.Close()
			edgeOut.Close()
			return
		}
		c, up := res.Wrap(conn, edgeOut)
		// Relay until the client closes.
		var relay sync.WaitGroup
		relay.Go(func() {
			buf := make([]byte, 16<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 {
					c.Write(buf[:n])
				}
				if err != nil {
					c.Close()
					return
				}
			}
		})
		buf := make([]byte, 16<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				up.Write(buf[:n])
			}
			if err != nil {
				up.Close()
				break
			}
		}
		relay.Wait()
	})
	tc := tls.Client(clientSide, client)
	cerr := tc.Handshake()
	if cerr == nil && !tc.ConnectionState().ECHAccepted {
		b.Fatal("ECH not accepted")
	}
	clientSide.Close()
	wg.Wait()
	if cerr != nil || berr != nil || eerr != nil {
		b.Fatal(cerr, berr, eerr)
	}
}
