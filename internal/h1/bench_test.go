package h1

import "testing"

// BenchmarkConn observes a typical small GET and its 200 response with a
// 13-byte body, each passing in one chunk, on a fresh Conn per exchange
// (new connection) and on one Conn (keep-alive).
func BenchmarkConn(b *testing.B) {
	req := []byte("GET /api/v1/items?id=42 HTTP/1.1\r\nHost: app.example.com\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n")
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Tue, 01 Dec 2026 12:00:00 GMT\r\nContent-Length: 13\r\n\r\nHello, world!")
	var n int
	done := func(x Exchange) { n += int(x.Bytes) }
	b.Run("keepalive", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(req) + len(resp)))
		c := &Conn{Done: done}
		for b.Loop() {
			c.Request(req)
			c.Response(resp)
		}
		if c.Err() != nil {
			b.Fatal(c.Err())
		}
	})
	b.Run("newconn", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(req) + len(resp)))
		for b.Loop() {
			c := &Conn{Done: done}
			c.Request(req)
			c.Response(resp)
			c.ResponseEOF()
		}
	})
}
