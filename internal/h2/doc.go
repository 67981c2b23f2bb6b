// Package h2 observes HTTP/2 exchanges passing through a byte copier,
// without altering them.
//
// It is the HTTP/2 sibling of package h1, with the same shape: a proxy
// that forwards an HTTP/2 connection with prior knowledge (h2c) by
// copying bytes verbatim, one goroutine per direction, hands each chunk it
// forwards to a Conn: Request for the bytes going to the server (they
// start with the client connection preface), Response for those coming
// back, ResponseEOF when the server's side ends. The Conn reads the frames
// in them, decodes the header blocks with HPACK, one decoder per
// direction, and calls Done once per stream the client opened, when the
// server's side of it ended (END_STREAM) or either side reset it
// (RST_STREAM). A recorder (an HTTP inspector) gets each stream's
// header blocks, decoded, and DATA payloads as they pass, through Header
// and Data.
//
// Typical use, in the copier:
//
//	var obs h2.Conn
//	obs.Done = func(x h2.Exchange) {
//		log.Info("http", "method", x.Method, "path", x.Target,
//			"status", x.Status, "bytes", x.Bytes, "reset", x.Reset,
//			"took", time.Since(x.Start))
//	}
//	go func() { // client to server
//		for {
//			n, err := client.Read(buf)
//			obs.Request(buf[:n]) // before the write: see ErrMalformed
//			if _, werr := server.Write(buf[:n]); werr != nil || err != nil {
//				return
//			}
//		}
//	}()
//	// server to client: obs.Response(buf[:n]) before each write to the
//	// client, then obs.ResponseEOF().
//
// Frames are read as RFC 9113 lays them out, with the frame types, flags
// and settings of golang.org/x/net/http2 and its hpack decoder. Header
// blocks are bounded to 1 MiB, frames to the size the receiving side
// advertised (SETTINGS_MAX_FRAME_SIZE, at most 16 MiB), the tracked open
// streams to 10,000; DATA payloads are counted, never kept (but passed to
// Data). On a
// malformed or oversized frame or header block, observing stops (Err says
// why) and every later call returns at once: the copier goes on copying.
package h2
