package agent

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Endpoint describes a public endpoint to bind on the edge.
type Endpoint struct {
	// URL names the endpoint:
	//   - "http://abc", "abc" or "http://abc.example.test": HTTP requests for
	//     abc under the edge's domain; "" or "http://": a random name.
	//   - "https://abc" or "https://abc.example.test": the same, with TLS
	//     terminated at the edge (its certificate, HTTP/2 or HTTP/1.1 by
	//     ALPN); the app gets plain HTTP, with X-Forwarded-Proto https.
	//   - "tls://app.example.test", "tls://*.app.example.test": TLS
	//     connections whose server name matches, passed through untouched
	//     (the app terminates TLS).
	//   - "tcp://" for any free port, "tcp://:20001" for that port.
	// A port in an http, https or tls URL is ignored: the edge's ports
	// apply.
	URL string

	// AppProtocol is what the edge speaks to the app on an http or https
	// endpoint's conns: "" or "http1" for HTTP/1.1, "h2c" for HTTP/2
	// without TLS (prior knowledge), which gRPC services need for their
	// streams and trailers. Public clients may use HTTP/1.1 or HTTP/2
	// either way.
	AppProtocol string

	// Pool joins the endpoint when this agent's identity already holds
	// it, so that several sessions share its connections, rather than
	// fail with ErrNameTaken.
	Pool bool
}

// parseEndpoint turns an endpoint URL into a bind request.
func parseEndpoint(endpoint string) (wire.Bind, error) {
	b := wire.Bind{Proto: wire.ProtoHTTP}
	if endpoint == "" {
		return b, nil
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return b, fmt.Errorf("agent: endpoint %q: %w", endpoint, err)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
		return b, fmt.Errorf("agent: endpoint %q: want scheme://name only", endpoint)
	}
	switch u.Scheme {
	case wire.ProtoHTTP, wire.ProtoHTTPS, wire.ProtoTLS:
		b.Proto = u.Scheme
		b.Name = u.Hostname()
		if b.Proto == wire.ProtoTLS && b.Name == "" {
			return b, fmt.Errorf("agent: endpoint %q: a tls endpoint needs a name", endpoint)
		}
	case wire.ProtoTCP:
		b.Proto = wire.ProtoTCP
		if u.Hostname() != "" && u.Port() == "" {
			return b, fmt.Errorf("agent: endpoint %q: want tcp:// or tcp://:PORT", endpoint)
		}
		if p := u.Port(); p != "" {
			port, err := strconv.Atoi(p)
			if err != nil || port < 1 || port > 65535 {
				return b, fmt.Errorf("agent: endpoint %q: bad port", endpoint)
			}
			b.Port = port
		}
	default:
		return b, fmt.Errorf("agent: endpoint %q: unsupported scheme %q (want http, https, tls or tcp)", endpoint, u.Scheme)
	}
	return b, nil
}
