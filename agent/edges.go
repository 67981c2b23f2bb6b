package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// edgeTimeout bounds opening a session to one edge (the dial, TLS, the
// hello), as the edge's own HandshakeTimeout does by default: an edge that
// does not answer holds up the next one no longer.
const edgeTimeout = 10 * time.Second

// errEdgeTimeout is the cause of an attempt that took edgeTimeout.
var errEdgeTimeout error = edgeTimeoutError{}

type edgeTimeoutError struct{}

func (edgeTimeoutError) Error() string   { return "edge did not answer within " + edgeTimeout.String() }
func (edgeTimeoutError) Timeout() bool   { return true }
func (edgeTimeoutError) Temporary() bool { return true }

var _ net.Error = edgeTimeoutError{}

// edges returns the edges' addresses in the order they are tried: Addrs,
// each once, empty ones left out.
func (c *Client) edges() ([]string, error) {
	list := make([]string, 0, len(c.Addrs))
	for _, a := range c.Addrs {
		if strings.Contains(a, ",") {
			return nil, fmt.Errorf("agent: edge address %q holds a comma: give each edge its own entry in Client.Addrs", a)
		}
		if a != "" && !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	if len(list) == 0 {
		return nil, errors.New("agent: no edge address: Client.Addrs holds none")
	}
	return list, nil
}

// nextEdge returns the edge the next connection attempt goes to.
func (c *Client) nextEdge(edges []string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return edges[c.next%len(edges)]
}

// takeEdge returns the edge the next connection attempt goes to, and moves
// on: the attempt after it, whether this one fails or its session ends
// later, goes to the edge after it.
func (c *Client) takeEdge(edges []string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := edges[c.next%len(edges)]
	c.next = (c.next + 1) % len(edges)
	return a
}

// edgesError is the failure of a round of connection attempts, one per
// edge. errors.Is matches any of them.
type edgesError struct {
	addrs []string
	errs  []error
}

func (e *edgesError) Error() string {
	var b strings.Builder
	b.WriteString("agent: no edge took the session: ")
	e.list(&b)
	return b.String()
}

// list writes each edge and its failure: "a: why; b: why".
func (e *edgesError) list(b *strings.Builder) {
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.addrs[i])
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(err.Error(), "agent: "))
	}
}

func (e *edgesError) Unwrap() []error { return e.errs }

// tlsConfig returns the TLS configuration to the edge at addr, or nil for
// plaintext. It offers the agent protocol by ALPN (wire.ALPN) and nothing
// else, which an edge's public TLS port takes for an agent's session. The
// edge selects it, or no protocol (an agent port whose TLS knows no ALPN):
// crypto/tls refuses a selection the client did not offer.
func (c *Client) tlsConfig(addr string) *tls.Config {
	if c.Plaintext {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	var cfg *tls.Config
	switch {
	case c.TLSConfig != nil:
		cfg = c.TLSConfig.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = host
		}
	case host == "localhost":
		return nil
	default:
		if a, err := netip.ParseAddr(host); err == nil && a.IsLoopback() {
			return nil
		}
		cfg = &tls.Config{ServerName: host}
	}
	cfg.NextProtos = []string{wire.ALPN}
	return cfg
}
