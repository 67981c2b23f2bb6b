// Package edge is the public side of a tunnel: it accepts agent sessions
// and routes public traffic to them. HTTP requests are routed by Host: an
// agent that binds the name "abc" is reached at abc.<Domain>. TLS
// connections are routed by server name on the ServeSNI listeners: passed
// through untouched to tls:// endpoints, or terminated by the edge for
// https:// endpoints (HTTP/2 and HTTP/1.1, with Certificates,
// GetCertificate or ACME). TCP endpoints get a port of their own. With a
// certificate, the ServeSNI listeners take agent sessions too, told apart
// by ALPN (see Server.NoAgentsOnTLS): one port 443 for browsers and agents.
//
// Typical use, in a control plane of your own:
//
//	srv := &edge.Server{Domain: "example.test", Logger: slog.Default()}
//	go srv.ServeAgents(agentListener)   // agents connect here
//	go srv.ServeHTTPListener(httpListener) // or mount srv as an http.Handler
//	go srv.ServeSNI(tlsListener)        // tls:// and https:// endpoints
//	...
//	srv.Shutdown(ctx)
//
// Where traffic goes is decided by a [router.Router] (an in-memory [router.MemoryRouter]
// by default) and how the agent is reached by a [Dialer] (by default a
// stream on the agent's session held by this Server). Both are small
// interfaces over plain data, so that a control plane can keep routes in its
// own store and reach agents connected to other edges.
//
// Several edges form a cluster when they share a Router that implements
// router.RouteWatcher (router/etcdrouter) and reach each other's agents
// through a relay (package edge/relay): each edge's relay certificate
// names it (tunnelkit-edge://<ID>, see relay.PeerURI), and an edge relays
// only for members of its cluster, and only streams for routes it holds
// (Server.ServeRelayStream).
//
// Each endpoint may carry a traffic policy (package policy): the agent
// declares one with the bind, the operator adds its own (Server.Policy),
// and the edge enforces both before it opens a stream to the agent:
// client addresses, rate limits, logins (basic, OpenID Connect through
// Server.OIDC), client certificates, webhook signatures and headers. Every
// edge sharing a Router enforces the policy of the routes it takes traffic
// for.
//
// The protocol between agent and edge, and between the edges of a
// cluster, is described in docs/PROTOCOL.md.
package edge
