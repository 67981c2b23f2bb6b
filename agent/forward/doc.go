// Package forward connects the conns of a net.Listener, a tunnel's or any
// other, to a local address: "expose localhost:3000".
//
// It has two modes, one type each. [Bytes] copies each conn's bytes to a
// new connection to the app, both ways, half-closes kept, and logs a line
// per connection; it serves any protocol (tcp, tls, http). [HTTP] forwards
// the HTTP requests the conns carry to the app, logging a line per
// request: it copies the bytes too, and finds the requests in them as
// they pass. A [Recorder] may record the requests as they pass, and
// replay them: an *inspect.Inspector (package agent/inspect, which this
// package does not import) does, to show them on its page.
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
// When the app cannot be reached, a conn that has a Reject(error) error
// method (an *agent.Conn) is rejected by Bytes with the reason, so that
// the edge tells its client that the app, not the tunnel, is down; HTTP
// answers each request itself, as the edge answers (502 app_unreachable).
package forward

import "errors"

// ErrHandedOver is for a listener that hands its next conns to another
// forwarder, as an agent does whose endpoint changes its app in place: an
// Accept that fails with an error wrapping it makes Serve take no more
// conns, and return nil once those it serves have ended by themselves,
// closing none, so that the requests and connections under way end as
// they would have.
var ErrHandedOver = errors.New("forward: listener handed over")
