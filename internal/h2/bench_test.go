package h2

import (
	"testing"
)

// BenchmarkConn observes a small unary exchange: a GET, and a 200 with a
// 13-byte body, each passing in one chunk, on one Conn (a connection that
// carries many requests) and on a fresh Conn per exchange (a new
// connection, preface and SETTINGS included).
func BenchmarkConn(b *testing.B) {
	fields := []string{":method", "GET", ":scheme", "http", ":authority", "app.example.com", ":path", "/api/v1/items?id=42",
		"user-agent", "Go-http-client/2.0", "accept-encoding", "gzip"}
	var n int
	done := func(x Exchange) { n += int(x.Bytes) }
	b.Run("keepalive", func(b *testing.B) {
		// Build a stream of exchanges on stream ids 1, 3, ... ahead of time.
		const exchanges = 1 << 12
		reqs, resps := newWire(true), newWire(false)
		req0, resp0 := reqs.Len(), resps.Len()
		var req, resp [][]byte
		for i := range exchanges {
			id := uint32(2*i + 1)
			r, s := reqs.Len(), resps.Len()
			reqs.headers(id, true, fields...)
			resps.headers(id, false, ":status", "200", "content-type", "text/plain; charset=utf-8", "date", "Tue, 01 Dec 2026 12:00:00 GMT")
			resps.fr.WriteData(id, true, []byte("Hello, world!"))
			req, resp = append(req, reqs.Bytes()[r:reqs.Len()]), append(resp, resps.Bytes()[s:resps.Len()])
		}
		b.ReportAllocs()
		b.SetBytes(int64(len(req[1]) + len(resp[1])))
		var c *Conn
		i := exchanges
		for b.Loop() {
			if i == exchanges {
				c = &Conn{Done: done}
				c.Request(reqs.Bytes()[:req0])
				c.Response(resps.Bytes()[:resp0])
				i = 0
			}
			c.Request(req[i])
			c.Response(resp[i])
			i++
		}
		if c.Err() != nil {
			b.Fatal(c.Err())
		}
	})
	b.Run("newconn", func(b *testing.B) {
		req := newWire(true).headers(1, true, fields...).Bytes()
		w := newWire(false).headers(1, false, ":status", "200", "content-type", "text/plain; charset=utf-8")
		w.fr.WriteData(1, true, []byte("Hello, world!"))
		resp := w.Bytes()
		b.ReportAllocs()
		b.SetBytes(int64(len(req) + len(resp)))
		for b.Loop() {
			c := &Conn{Done: done}
			c.Request(req)
			c.Response(resp)
			c.ResponseEOF()
			if c.Err() != nil {
				b.Fatal(c.Err())
			}
		}
	})
}
