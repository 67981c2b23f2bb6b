package proxyproto

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// ---- Headers ----

// equal reports whether two headers are the same value (nil and empty TLV
// values alike).
func equal(a, b *Header) bool {
	if a.Version != b.Version || a.Command != b.Command ||
		a.Source != b.Source || a.Destination != b.Destination || len(a.TLVs) != len(b.TLVs) {
		return false
	}
	for i := range a.TLVs {
		if a.TLVs[i].Type != b.TLVs[i].Type || !bytes.Equal(a.TLVs[i].Value, b.TLVs[i].Value) {
			return false
		}
	}
	return true
}

// describe formats h for test messages.
func describe(h *Header) string {
	if h == nil {
		return "<nil>"
	}
	var tlvs strings.Builder
	for _, t := range h.TLVs {
		fmt.Fprintf(&tlvs, " %#02x:%q", t.Type, t.Value)
	}
	return fmt.Sprintf("v%d %v %v -> %v%s", h.Version, h.Command, h.Source, h.Destination, tlvs.String())
}

// readBytes runs Read on b, and returns the header, the error and what is
// left in the reader afterwards.
func readBytes(b []byte) (*Header, []byte, error) {
	br := bufio.NewReader(bytes.NewReader(b))
	h, err := Read(br)
	rest, rerr := io.ReadAll(br)
	if rerr != nil {
		panic(rerr)
	}
	return h, rest, err
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// ---- Readers and conns ----

// errSilence is what a scriptReader returns when read past its script.
var errSilence = errors.New("script: read past the end of the script")

// scriptReader returns its chunks, one per Read, then fails the test if read
// again: the writer is silent, and a Read that reads again would have
// waited for a byte it did not need.
type scriptReader struct {
	tb     testing.TB
	chunks [][]byte
	reads  int
}

func (r *scriptReader) Read(p []byte) (int, error) {
	r.reads++
	if len(r.chunks) == 0 {
		r.tb.Errorf("read %d: read past the last byte sent, so Read would have waited", r.reads)
		return 0, errSilence
	}
	n := copy(p, r.chunks[0])
	if r.chunks[0] = r.chunks[0][n:]; len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

// bytewise cuts s into one-byte chunks.
func bytewise(s string) [][]byte {
	var cs [][]byte
	for i := range len(s) {
		cs = append(cs, []byte{s[i]})
	}
	return cs
}

// tcpPair returns the two ends of a loopback TCP connection; both are closed
// when the test ends.
func tcpPair(tb testing.TB) (client, server *net.TCPConn) {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   *net.TCPConn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.AcceptTCP()
		accepted <- result{c, err}
	}()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	r := <-accepted
	if err != nil || r.err != nil {
		tb.Fatalf("loopback pair: dial %v, accept %v", err, r.err)
	}
	tb.Cleanup(func() { client.Close(); r.c.Close() })
	return client, r.c
}

// guard sets a read deadline on c far enough not to pass in a passing test,
// so that a read that waits when it should not fails instead of hanging.
func guard(tb testing.TB, c net.Conn) {
	tb.Helper()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		tb.Fatal(err)
	}
}

// ---- Leaks ----
