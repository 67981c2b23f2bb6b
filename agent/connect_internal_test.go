package agent

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// TestConnectKeepsBytesAfterTheAnswer: bytes that come in the same read as
// the proxy's 200 (the edge's, sent first) reach the session, not the
// CONNECT parser's buffer.
func TestConnectKeepsBytesAfterTheAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.0 200 Connection established\r\n\r\nfirst bytes")
		io.Copy(c, br) // then an echo
	}()
	c := &Client{Proxy: ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}
	conn, err := c.dialEdge(t.Context(), "edge.example.test:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, len("first bytes"))
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "first bytes" {
		t.Fatalf("read %q, %v; want the bytes after the answer", got, err)
	}
	io.WriteString(conn, "ping")
	got = make([]byte, 4)
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo %q, %v", got, err)
	}
}
