package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/urlpath"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
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
	// apply. An http or https URL may end in a path ("https://abc/api"):
	// the endpoint then takes the requests for its name whose path is
	// that one or under it, unless an endpoint of a longer path takes
	// them, and the name's endpoint without a path the others. Every
	// path of a name is its owner's (docs/PROTOCOL.md, "Who owns a name").
	URL string

	// StripPrefix, for an URL with a path, has the edge send the app each
	// request's path without it ("/api/x" as "/x", "/api" as "/"), with
	// X-Forwarded-Prefix set to it. Sent only when set.
	StripPrefix bool

	// AppProtocol is what the edge speaks to the app on an http or https
	// endpoint's conns: "" or "http1" for HTTP/1.1, "h2c" for HTTP/2
	// without TLS (prior knowledge), which gRPC services need for their
	// streams and trailers. Public clients may use HTTP/1.1 or HTTP/2
	// either way.
	AppProtocol string

	// VerboseErrors shows the public what went wrong (the dial error,
	// the app's address, a certificate's detail) in the error pages of
	// an http or https endpoint, the edge's and the forwarder's, as for
	// development; sent to the edge only when set (an edge that predates
	// it refuses the endpoint). False: the pages say what happened in
	// words, with a request ID, and the detail goes to the logs only.
	VerboseErrors bool

	// Pool joins the endpoint when this agent's identity already holds
	// it, so that several sessions share its connections, rather than
	// fail with ErrNameTaken.
	Pool bool

	// Policy is the traffic policy the edge enforces on the endpoint's
	// connections and requests before they reach the listener (see
	// package policy): client addresses, rate limits, logins, webhook
	// signatures, headers. It is checked against the endpoint's protocol
	// before the bind, and sent with it (its secrets included: use TLS to
	// the edge). An edge that cannot enforce all of it refuses the
	// endpoint (ErrRefused) rather than serve it without. Nil: none.
	Policy *policy.Spec

	// HealthCheck, when set, is checked by the agent, which tells the edge
	// when the app goes down or comes up again: the edge routes nothing
	// to the endpoint while its app is down, nor before the first check
	// passed (see HealthCheck). An edge older than protocol version 5
	// refuses the endpoint. Nil: none; the endpoint takes connections
	// while its agent is reached.
	HealthCheck *HealthCheck

	// Ticket is the endpoint ticket of an earlier listener of this
	// endpoint (Listener.Ticket, kept across a restart of the process),
	// sent with the first bind as a reconnection sends it. The edge
	// decides nothing on it (docs/PROTOCOL.md, Tickets): getting a name back
	// is the session ticket's business (Client.ResumeTicket). Empty: none.
	Ticket string
}

// parseEndpoint turns an endpoint URL into a bind request. Its errors
// quote the URL as given and say what is wrong in it.
func parseEndpoint(endpoint string) (wire.Bind, error) {
	b := wire.Bind{Proto: wire.ProtoHTTP}
	if endpoint == "" {
		return b, nil
	}
	bad := func(format string, args ...any) (wire.Bind, error) {
		return b, fmt.Errorf("agent: endpoint %q: %s", endpoint, fmt.Sprintf(format, args...))
	}
	full := endpoint
	if !strings.Contains(endpoint, "://") {
		// "http:/x", "https:abc", "tcp//:20001": a scheme short of "://".
		lower := strings.ToLower(endpoint)
		for _, s := range [...]string{wire.ProtoHTTP, wire.ProtoHTTPS, wire.ProtoTLS, wire.ProtoTCP} {
			if !strings.HasPrefix(lower, s) {
				continue
			}
			rest := endpoint[len(s):]
			if r, ok := strings.CutPrefix(rest, ":"); ok {
				return bad("a scheme takes \"://\" after it: %s://%s", s, strings.TrimLeft(r, "/"))
			}
			if r, ok := strings.CutPrefix(rest, "//"); ok {
				return bad("a scheme takes \"://\" after it: %s://%s", s, r)
			}
		}
		full = "http://" + endpoint
	}
	u, err := url.Parse(full)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is quoted already
		}
		return bad("%v", err)
	}
	switch {
	case u.User != nil:
		return bad("credentials (%q) have no place in an endpoint: want scheme://name", u.User.String()+"@")
	case u.Path != "" && u.Path != "/" && u.Scheme != wire.ProtoHTTP && u.Scheme != wire.ProtoHTTPS:
		return bad("a path (%q) routes HTTP requests, and the traffic of a %s endpoint carries none: drop it", u.Path, u.Scheme)
	case u.RawQuery != "" || u.ForceQuery:
		return bad("a query (%q) has no place in an endpoint: want scheme://name", "?"+u.RawQuery)
	case u.Fragment != "":
		return bad("a fragment (%q) has no place in an endpoint: want scheme://name", "#"+u.Fragment)
	}
	switch u.Scheme {
	case wire.ProtoHTTP, wire.ProtoHTTPS, wire.ProtoTLS:
		b.Proto = u.Scheme
		b.Name = u.Hostname()
		if b.Proto == wire.ProtoTLS && b.Name == "" {
			return bad("a tls endpoint needs a name: tls://app.example.com")
		}
		path, err := urlpath.Prefix(u.EscapedPath())
		if err != nil {
			return bad("%v", err)
		}
		if path != "" {
			b.Options = map[string]string{wire.OptPath: path}
		}
	case wire.ProtoTCP:
		b.Proto = wire.ProtoTCP
		if h := u.Hostname(); h != "" && u.Port() == "" {
			return bad("a tcp endpoint takes a port, not a host (%q): want tcp:// (any port) or tcp://:PORT", h)
		}
		if p := u.Port(); p != "" {
			port, err := strconv.Atoi(p)
			if err != nil || port < 1 || port > 65535 {
				return bad("port %q: want 1 to 65535", p)
			}
			b.Port = port
		}
	default:
		return bad("unsupported scheme %q: want http, https, tls or tcp", u.Scheme)
	}
	return b, nil
}

// bindPolicy adds spec, checked against the bind's protocol, to b. A nil or
// empty spec adds nothing.
func bindPolicy(b *wire.Bind, spec *policy.Spec) error {
	if spec.IsZero() {
		return nil
	}
	if err := spec.Validate(b.Proto); err != nil {
		return err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if len(raw) > policy.MaxSpecBytes {
		return fmt.Errorf("%w: %d bytes of JSON (at most %d)", policy.ErrTooLarge, len(raw), policy.MaxSpecBytes)
	}
	b.Policy = raw
	if b.Options == nil {
		b.Options = map[string]string{}
	}
	b.Options[wire.OptPolicy] = wire.PolicyVersion
	return nil
}

// bindPath adds ep's StripPrefix to b, whose path its URL gave, or says
// why it cannot have it.
func bindPath(b *wire.Bind, ep Endpoint) error {
	path := b.Options[wire.OptPath]
	switch {
	case ep.StripPrefix && path == "":
		return fmt.Errorf("agent: endpoint %q: strip prefix needs a path in the URL to strip, as in http://name/api", ep.URL)
	case path != "" && ep.Policy != nil && ep.Policy.OIDC != nil:
		return fmt.Errorf("agent: endpoint %q: an oidc login on an endpoint with a path: its callback, %s, is one for the whole name; put the login on the name's endpoint without a path", ep.URL, policy.CallbackPath)
	case ep.StripPrefix:
		b.Options[wire.OptStripPrefix] = "true"
	}
	return nil
}
