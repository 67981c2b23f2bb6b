package proxyproto_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
)

// The agent writes a header before the bytes it forwards.
func ExampleWrite() {
	src := netip.MustParseAddrPort("192.168.0.1:56324")
	dst := netip.MustParseAddrPort("192.168.0.11:443")

	var v1, v2 bytes.Buffer // stand-ins for the conns to the upstream
	proxyproto.Write(&v1, 1, src, dst)
	proxyproto.Write(&v2, 2, src, dst)
	fmt.Printf("%q\n", v1.String())
	fmt.Printf("% x\n", v2.Bytes())

	// An unknown client.
	var unknown bytes.Buffer
	proxyproto.Write(&unknown, 1, netip.AddrPort{}, dst)
	fmt.Printf("%q\n", unknown.String())
	// Output:
	// "PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
	// 0d 0a 0d 0a 00 0d 0a 51 55 49 54 0a 21 11 00 0c c0 a8 00 01 c0 a8 00 0b dc 04 01 bb
	// "PROXY UNKNOWN\r\n"
}

// Read takes the header and leaves what follows.
func ExampleRead() {
	conn := strings.NewReader("PROXY TCP6 2001:db8::1 2001:db8::11 56324 443\r\nGET / HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(conn)
	h, err := proxyproto.Read(br)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.Version, h.Command, h.Source, h.Destination)
	rest, _ := io.ReadAll(br)
	fmt.Printf("%q\n", rest)

	// Not a header: decided on the first byte, nothing consumed.
	br = bufio.NewReader(strings.NewReader("SSH-2.0-OpenSSH_9.6\r\n"))
	_, err = proxyproto.Read(br)
	fmt.Println(err)
	// Output:
	// 1 PROXY [2001:db8::1]:56324 [2001:db8::11]:443
	// "GET / HTTP/1.1\r\n\r\n"
	// proxyproto: no PROXY protocol header
}

// The edge behind a load balancer: Accept returns conns whose RemoteAddr is
// the client the load balancer relays.
func ExampleListener() {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ln := &proxyproto.Listener{
		Listener: inner, // ln owns it now
		Required: true,  // every conn comes through the load balancer
		Trusted:  proxyproto.TrustPrefixes(netip.MustParsePrefix("127.0.0.0/8")),
	}
	defer ln.Close()

	// The load balancer.
	go func() {
		lb, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			log.Fatal(err)
		}
		defer lb.Close()
		var b bytes.Buffer
		proxyproto.Write(&b, 2, netip.MustParseAddrPort("203.0.113.7:40000"), netip.MustParseAddrPort("198.51.100.1:443"))
		b.WriteString("hello")
		lb.Write(b.Bytes())
	}()

	conn, err := ln.Accept()
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	msg, _ := io.ReadAll(conn)
	fmt.Println(conn.RemoteAddr(), conn.LocalAddr(), string(msg))
	// Output:
	// 203.0.113.7:40000 198.51.100.1:443 hello
}
