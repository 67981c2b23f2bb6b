// Package forward connects the conns of a net.Listener, a tunnel's or any
// other, to a local address: "expose localhost:3000".
//
// It has two modes, one type each. [Bytes] copies each conn's bytes to a
// new connection to the app, both ways, half-closes kept, and logs a line
// per connection; it serves any protocol (tcp, tls, http). [HTTP] forwards
// the HTTP requests the conns carry to the app, logging a line per
// request; an [inspect.Inspector] may record them, to show them on its
// page and replay them.
//
// Typical use, behind an agent's listener:
//
//	l, err := agent.Listen(ctx, "edge.example.com:7000", "https://myapp")
//	if err != nil {
//		return err
//	}
//	fmt.Println("public URL:", l.URL())
//	return forward.HTTP{To: "127.0.0.1:3000", Logger: logger}.Serve(l)
//
// or, for any protocol, one connection at a time:
//
//	return forward.Bytes{To: "127.0.0.1:22"}.Serve(l)
//
// A conn that has a Reject(error) error method (an *agent.Conn) is rejected
// with the reason when the app cannot be reached, so that the edge tells
// its client that the app, not the tunnel, is down.
package forward
