// Package agent is the app side of a tunnel: a session to an edge whose
// listeners receive the public connections that reach the edge.
//
// Typical use, an HTTP app exposing itself:
//
//	l, err := agent.Listen(ctx, "edge.example.com:7000", "http://myapp")
//	if err != nil {
//		return err
//	}
//	fmt.Println("public URL:", l.URL())
//	return http.Serve(l, handler) // r.RemoteAddr is the real client
//
// Listen waits for the edge, within ctx: an edge not up yet, restarting,
// or refusing an endpoint for now is tried again with backoff, and only a
// failure that waiting would not cure (a token refused, a name taken, an
// address that is not an edge's agent port) ends it at once, with an error
// that says so. Once listening, the client reconnects by itself. A
// process that starts again gets its names back at once when it keeps its
// session ticket ([Client].Ticket) and gives it to its new Client
// ([Client].ResumeTicket), as the example agent's state file does.
//
// A [Client] carries several listeners over one session. Package
// [github.com/tunnelkit/tunnelkit/agent/forward] connects a listener to a
// local address instead ("expose localhost:3000"): byte for byte, or
// request by request with a log line for each; package
// [github.com/tunnelkit/tunnelkit/agent/inspect] shows those requests on a
// page, and replays them. An app that serves its listener itself imports
// neither.
//
// Behind a proxy, a Client opens its session through it: the one
// [Client].Proxy names (see [ProxyURL]), or by default the one HTTPS_PROXY,
// ALL_PROXY and NO_PROXY name ([ProxyFromEnvironment]); HTTP CONNECT or
// SOCKS5, with TLS to the edge inside the tunnel. Its failures wrap
// [ErrProxy]; a proxy that cannot be reached, or cannot reach the edge, is
// waited for as an edge is.
package agent
