// Package h1 observes HTTP/1.x messages passing through a byte copier,
// without altering them.
//
// A proxy that forwards an HTTP/1.1 connection by copying bytes verbatim,
// one goroutine per direction, hands each chunk it forwards to a Conn:
// Request for the bytes going to the server, Response for those coming
// back, ResponseEOF when the server's side ends. The Conn finds the
// messages in them (request and status lines, Content-Length and chunked
// bodies, bodies that run until the close, pipelined requests, 1xx
// interim responses, upgrades) and calls Done once per exchange, when the
// final response has passed whole. Waiting tells whether a request is
// still waiting for its response to begin, so that a proxy whose server
// closed the connection knows whether it may answer 502 itself.
// A recorder (an HTTP inspector) gets each message's head and its body's
// bytes, unchunked, as they pass, through Head and Body.
//
// Typical use, in the copier:
//
//	var obs h1.Conn
//	obs.Done = func(x h1.Exchange) {
//		log.Info("http", "method", x.Method, "path", x.Target,
//			"status", x.Status, "bytes", x.Bytes, "took", time.Since(x.Start))
//	}
//	go func() { // client to server
//		for {
//			n, err := client.Read(buf)
//			obs.Request(buf[:n]) // before the write: see ErrUnexpectedResponse
//			if _, werr := server.Write(buf[:n]); werr != nil || err != nil {
//				return
//			}
//		}
//	}()
//	// server to client: obs.Response(buf[:n]) after each write to the
//	// client, then obs.ResponseEOF(); if obs.Waiting(), answer 502.
//
// Parsing follows RFC 9112 and, where they differ, what net/http reads, so
// that what this package reports matches what a Go server and client see
// in the same bytes (a differential test and fuzz targets check this).
// Heads and trailer sections are bounded to 1 MiB and chunk size lines to
// 4 KiB; body bytes are counted, never kept. On a malformed or oversized
// message, or a response without a request, observing stops (Err says
// why) and every later call returns at once: the copier goes on copying.
package h1
