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
// A [Client] carries several listeners over one session; [Forward] copies a
// listener's connections to a local address ("expose localhost:3000"), and
// a [Forwarder] with HTTP set forwards an http or https endpoint request by
// request, logging a line for each, and shows them on an [Inspector]'s
// page, which replays them.
//
// Behind a proxy, a Client opens its session through it: the one
// [Client].Proxy names (see [ProxyURL]), or by default the one HTTPS_PROXY,
// ALL_PROXY and NO_PROXY name ([ProxyFromEnvironment]); HTTP CONNECT or
// SOCKS5, with TLS to the edge inside the tunnel. Its failures wrap
// [ErrProxy].
package agent
