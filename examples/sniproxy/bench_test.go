package main

import (
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkBulkVsDirect copies 64 MiB each way through the proxy and
// directly to the same echo backend, interleaved in every iteration, and
// reports the proxy's throughput as a ratio of the direct one (target
// >= 0.7).
//
// Run: go test -run '^$' -bench BulkVsDirect -benchtime 5x ./examples/sniproxy/
func BenchmarkBulkVsDirect(b *testing.B) {
	backend := echoBackend(b, nil)
	_, addr, _ := startProxy(b, "", "app.example.test="+backend)
	hello := clientHello(b, "app.example.test")
	const size = 64 << 20
	var direct, proxied time.Duration
	for range b.N {
		direct += bulkEcho(b, backend, hello, size)
		proxied += bulkEcho(b, addr, hello, size)
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * 2 * size / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(direct), "direct-MB/s")
	b.ReportMetric(mbps(proxied), "proxy-MB/s")
	b.ReportMetric(direct.Seconds()/proxied.Seconds(), "ratio")
}

// bulkEcho sends hello and size bytes to an echo server at addr, reads
// everything back, and returns the time taken.
func bulkEcho(b *testing.B, addr string, hello []byte, size int) time.Duration {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	go func() {
		c.Write(hello)
		buf := make([]byte, 256<<10)
		for sent := 0; sent < size; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	n, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
	if err != nil || n != int64(size+len(hello)) {
		b.Fatalf("echoed %d of %d bytes: %v", n, size+len(hello), err)
	}
	return time.Since(start)
}
