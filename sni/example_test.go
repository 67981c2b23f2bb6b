package sni_test

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/tunnelkit/tunnelkit/sni"
)

// A router reads the name a TLS client asks for, then hands the conn on
// with every byte intact.
func ExamplePeek() {
	clientSide, serverSide := net.Pipe()
	defer serverSide.Close()

	// A TLS client, as a browser would connect.
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer clientSide.Close()
		cfg := &tls.Config{ServerName: "App.Example.COM", NextProtos: []string{"h2", "http/1.1"}}
		tls.Client(clientSide, cfg).Handshake() // fails when the example closes its end
	}()

	hello, conn, err := sni.Peek(serverSide)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("route by:", hello.ServerName)
	fmt.Println("client sent:", hello.RawServerName)
	fmt.Println("ALPN:", hello.ALPN)

	// conn replays the ClientHello: a backend or tls.Server reads it whole.
	first := make([]byte, 1)
	conn.Read(first)
	fmt.Printf("first byte replayed: %#x\n", first[0])

	conn.Close()
	<-done
	// Output:
	// route by: app.example.com
	// client sent: App.Example.COM
	// ALPN: [h2 http/1.1]
	// first byte replayed: 0x16
}

// A client that does not speak TLS is recognised on its first byte, and
// nothing it sent is lost.
func ExamplePeek_notTLS() {
	clientSide, serverSide := net.Pipe()
	defer serverSide.Close()
	go func() {
		io.WriteString(clientSide, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
		clientSide.Close()
	}()

	_, conn, err := sni.Peek(serverSide)
	if errors.Is(err, sni.ErrNotTLS) {
		all, _ := io.ReadAll(conn) // serve it as plain text instead
		fmt.Printf("not TLS; replayed %q\n", all[:14])
	}
	// Output:
	// not TLS; replayed "GET / HTTP/1.1"
}

// A Peeker sets the limits. Here a client that never speaks times out.
func ExamplePeeker() {
	clientSide, serverSide := net.Pipe()
	defer clientSide.Close()
	defer serverSide.Close()

	p := sni.Peeker{Timeout: 20 * time.Millisecond, MaxBytes: 8 << 10}
	_, _, err := p.Peek(serverSide)
	var ne net.Error
	fmt.Println(errors.Is(err, sni.ErrTimeout), errors.As(err, &ne) && ne.Timeout())
	// Output:
	// true true
}

// Parse reads a ClientHello from bytes already at hand, here the first
// flight of a crypto/tls client.
func ExampleParse() {
	clientSide, serverSide := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer clientSide.Close()
		tls.Client(clientSide, &tls.Config{ServerName: "example.com."}).Handshake()
	}()
	buf := make([]byte, 16<<10)
	n, _ := serverSide.Read(buf) // a pipe delivers the hello's one write whole
	serverSide.Close()
	<-done

	hello, err := sni.Parse(buf[:n])
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println(hello.ServerName, hello.ECH)

	_, err = sni.Parse(buf[:n/2])
	fmt.Println(errors.Is(err, sni.ErrIncomplete))
	// Output:
	// example.com false
	// true
}

// NewConn makes a conn whose first bytes are replaced: what its reader sees
// first is the prefix, then the rest of the underlying conn.
func ExampleNewConn() {
	clientSide, serverSide := net.Pipe()
	go func() {
		io.WriteString(clientSide, " world")
		clientSide.Close()
	}()
	conn := sni.NewConn(serverSide, []byte("hello"))
	defer conn.Close()
	all, _ := io.ReadAll(conn)
	fmt.Printf("%s\n", all)
	// Output:
	// hello world
}
