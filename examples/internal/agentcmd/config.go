package agentcmd

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/examples/internal/yamlcfg"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// fileConfig is an agent's -config file: the settings of the session at
// the top, then the endpoints, all on the one session.
//
//	edge: edge.example.com:443
//	token: ${TUNNELKIT_TOKEN}
//	endpoints:
//	  - url: https://app.example.com
//	    to: 3000
type fileConfig struct {
	Edge      yamlcfg.Strings `yaml:"edge"`                                // -edge: one address, or a list
	Token     string          `yaml:"token" secret:"a token"`              // -token
	Proxy     string          `yaml:"proxy" secret:"a proxy password,url"` // -proxy; a secret when it has a password
	ProxyCA   string          `yaml:"proxy_ca"`                            // -proxy-ca
	EdgeCA    string          `yaml:"edge_ca"`                             // -edge-ca
	Plaintext *bool           `yaml:"plaintext"`
	Wait      string          `yaml:"wait"`               // -wait, a duration
	Heartbeat string          `yaml:"heartbeat_interval"` // -heartbeat-interval, a duration
	Metrics   string          `yaml:"metrics"`            // -metrics
	Inspect   string          `yaml:"inspect"`            // -inspect
	State     *string         `yaml:"state"`              // -state
	Endpoints []fileEndpoint  `yaml:"endpoints"`
}

// fileEndpoint is one endpoint of a -config file: the keys are the
// endpoint flags' names, with _ for -, and policy the traffic policy in
// the form the edge takes.
type fileEndpoint struct {
	URL          string    `yaml:"url"`
	To           string    `yaml:"to"`
	ToCA         string    `yaml:"to_ca"`
	ToServerName string    `yaml:"to_server_name"`
	HostHeader   string    `yaml:"host_header"`
	AppProtocol  string    `yaml:"app_protocol"`
	LogRequests  *bool     `yaml:"log_requests"`
	Pool         bool      `yaml:"pool"`
	StripPrefix  bool      `yaml:"strip_prefix"`
	ProxyProto   int       `yaml:"proxy_proto"`
	Policy       yaml.Node `yaml:"policy"`
	// VerboseErrors shows the public the detail of errors (for
	// development), as -verbose-errors does.
	VerboseErrors bool `yaml:"verbose_errors"`
	// HealthCheck is the agent's check of the app: -health-check and
	// -health-interval, and more.
	HealthCheck *healthSpec `yaml:"health_check"`
}

// healthSpec is an endpoint's health check, as written: an HTTP GET of
// Path, or with TCP a connection to the app (see agent.HealthCheck).
type healthSpec struct {
	Path           string `yaml:"path" json:"path,omitempty"`
	TCP            bool   `yaml:"tcp" json:"tcp,omitempty"`
	Interval       string `yaml:"interval" json:"interval,omitempty"`
	Timeout        string `yaml:"timeout" json:"timeout,omitempty"`
	UnhealthyAfter *int   `yaml:"unhealthy_after" json:"unhealthy_after,omitempty"`
	HealthyAfter   *int   `yaml:"healthy_after" json:"healthy_after,omitempty"`
}

// endpointSpec is an endpoint as the agent runs it: from the command line
// or a -config file, checked.
type endpointSpec struct {
	URL          string       `json:"url"`
	To           string       `json:"to"`
	ToCA         string       `json:"to_ca,omitempty"`
	ToServerName string       `json:"to_server_name,omitempty"`
	HostHeader   string       `json:"host_header,omitempty"`
	AppProtocol  string       `json:"app_protocol,omitempty"`
	LogRequests  bool         `json:"log_requests"`
	Pool         bool         `json:"pool,omitempty"`
	StripPrefix  bool         `json:"strip_prefix,omitempty"`
	ProxyProto   int          `json:"proxy_proto,omitempty"`
	Policy       *policy.Spec `json:"policy,omitempty"`
	// VerboseErrors: see agent.Endpoint.VerboseErrors.
	VerboseErrors bool `json:"verbose_errors,omitempty"`
	// HealthCheck: see agent.Endpoint.HealthCheck; nil for none.
	HealthCheck *healthSpec `json:"health_check,omitempty"`

	where  string             // for errors: "agent.yml:12: endpoint 2", or "" for the command line's
	flags  bool               // from the command line: errors name flags, not keys
	target target             // To, parsed
	toTLS  *tls.Config        // TLS to the app, when target.tls
	health *agent.HealthCheck // HealthCheck, checked and made
}

// key tells endpoints apart across a reload: an endpoint whose key is
// the same is left as it is.
func (e endpointSpec) key() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// stateKey names the endpoint in the state file: its URL and app as
// written, which a change of its other settings keeps.
func (e endpointSpec) stateKey() string { return e.URL + " -> " + e.To }

// endpoint is what the agent asks the edge for.
func (e endpointSpec) endpoint() agent.Endpoint {
	return agent.Endpoint{URL: e.URL, AppProtocol: e.AppProtocol, Pool: e.Pool, Policy: e.Policy, VerboseErrors: e.VerboseErrors, StripPrefix: e.StripPrefix, HealthCheck: e.health}
}

// healthCheck checks hs, the health check of the endpoint e, whose app is
// its target, and makes it; fail says what is wrong, naming the key.
func (e *endpointSpec) healthCheck(hs *healthSpec, fail func(string, ...any) error) (*agent.HealthCheck, error) {
	n := func(key string) string { return e.name("health_check") + "." + key }
	if e.flags {
		n = func(key string) string {
			return map[string]string{"path": "-health-check", "interval": "-health-interval"}[key]
		}
	}
	hc := &agent.HealthCheck{}
	for _, th := range []struct {
		key string
		v   *int
		to  *int
	}{{"unhealthy_after", hs.UnhealthyAfter, &hc.UnhealthyAfter}, {"healthy_after", hs.HealthyAfter, &hc.HealthyAfter}} {
		if th.v != nil && *th.v < 1 {
			return nil, fail("%s %d: want 1 at least", n(th.key), *th.v)
		}
		if th.v != nil {
			*th.to = *th.v
		}
	}
	for _, d := range []struct {
		key, v string
		to     *time.Duration
	}{{"interval", hs.Interval, &hc.Interval}, {"timeout", hs.Timeout, &hc.Timeout}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v <= 0 {
			return nil, fail("%s %q: want a duration, such as 10s", n(d.key), d.v)
		}
		*d.to = v
	}
	switch {
	case hs.Path == "" && !hs.TCP:
		return nil, fail("%s: want path (an HTTP GET of it) or tcp: true (a connection)", e.name("health_check"))
	case hs.Path != "" && hs.TCP:
		return nil, fail("%s: path or tcp, not both", e.name("health_check"))
	case hs.Path != "" && !strings.HasPrefix(hs.Path, "/"):
		return nil, fail("%s %q: want a path that starts with /", n("path"), hs.Path)
	case hs.Path != "" && !e.httpMode() && e.scheme() != "http" && e.scheme() != "https":
		return nil, fail("%s: an HTTP check, for an http or https URL; use tcp: true", n("path"))
	}
	interval := cmp.Or(hc.Interval, agent.DefaultHealthInterval)
	timeout := cmp.Or(hc.Timeout, min(agent.DefaultHealthTimeout, interval/2))
	switch {
	case interval < time.Second:
		return nil, fail("%s %v: want 1s at least", n("interval"), interval)
	case timeout >= interval:
		return nil, fail("%s %v: want less than the interval, %v", n("timeout"), timeout, interval)
	}
	t := e.target
	if hs.TCP {
		hc.Check = agent.TCPCheck(t.network, t.addr)
		return hc, nil
	}
	host, scheme := t.addr, "http"
	if t.network == "unix" {
		host = "localhost"
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, t.network, t.addr)
	}, DisableKeepAlives: true}
	if t.tls {
		scheme, tr.TLSClientConfig = "https", e.toTLS.Clone() // the transport sets its NextProtos
	}
	// The protocol the edge's requests reach the app in.
	if e.AppProtocol == "h2c" {
		var protos http.Protocols
		if t.tls {
			protos.SetHTTP2(true) // HTTP/2 over TLS (ALPN h2), as the forwarders speak it
		} else {
			protos.SetUnencryptedHTTP2(true) // with prior knowledge
		}
		tr.Protocols = &protos
	}
	// The Host the forwarder sends (host_header); none: the app's address.
	hc.Check = agent.HTTPCheckHost(&http.Client{Transport: tr}, scheme+"://"+host+hs.Path, t.hostHeader(e.HostHeader))
	return hc, nil
}

// atEdge reports whether e and o ask the edge for different settings of
// one endpoint: the app protocol, pool, policy, verbose errors.
func (e endpointSpec) atEdge(o endpointSpec) bool {
	// What the edge is told: the endpoint's settings as written (the
	// health check's, not the func made of them).
	type atEdge struct {
		AppProtocol   string
		Pool          bool
		Policy        any
		VerboseErrors bool
		StripPrefix   bool
		HealthCheck   *healthSpec
	}
	of := func(s endpointSpec) string {
		b, err := json.Marshal(atEdge{s.AppProtocol, s.Pool, s.Policy, s.VerboseErrors, s.StripPrefix, s.HealthCheck})
		if err != nil {
			panic("agentcmd: " + err.Error()) // plain data: cannot fail
		}
		return string(b)
	}
	return of(e) != of(o)
}

// scheme returns the endpoint's scheme, as the agent package reads its
// URL: "http" for "" and for a bare name.
func (e endpointSpec) scheme() string {
	scheme, _, ok := strings.Cut(e.URL, "://")
	if e.URL == "" || !ok {
		return "http"
	}
	return strings.ToLower(scheme)
}

// httpMode reports whether the agent forwards the endpoint request by
// request.
func (e endpointSpec) httpMode() bool {
	s := e.scheme()
	return (s == "http" || s == "https") && e.LogRequests
}

// name returns the name of the endpoint's key as the user gave it: the
// file's key (to_ca), or the flag (-to-ca).
func (e *endpointSpec) name(key string) string {
	if e.flags {
		return "-" + strings.ReplaceAll(key, "_", "-")
	}
	return key
}

// check checks the endpoint's settings against each other, and reads its
// target and to_ca. The error names where the endpoint was given.
func (e *endpointSpec) check(readFile func(string) ([]byte, error)) error {
	fail := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		if e.flags {
			return errors.New(msg)
		}
		return fmt.Errorf("%s: %s", e.where, msg)
	}
	n := e.name
	if e.To == "" {
		return fail("nothing to forward to: give %s, as 3000, host:port, https://host:port or unix:/path", n("to"))
	}
	t, err := parseTarget(e.To)
	if err != nil {
		return fail("%s %v", n("to"), err)
	}
	e.target = t
	scheme := e.scheme()
	isHTTP := scheme == "http" || scheme == "https"
	if e.ProxyProto < 0 || e.ProxyProto > 2 {
		return fail("%s %d: want 1 or 2 (0: none)", n("proxy_proto"), e.ProxyProto)
	}
	switch e.AppProtocol {
	case "", "http1", "h2c":
	default:
		return fail("%s %q: want http1 or h2c", n("app_protocol"), e.AppProtocol)
	}
	if e.AppProtocol != "" && !isHTTP {
		return fail("%s %s: only for an http or https URL (a %s endpoint's bytes reach the app as the client sent them)", n("app_protocol"), e.AppProtocol, scheme)
	}
	if e.httpMode() && e.ProxyProto != 0 {
		return fail("%s %d: for an http or https URL the agent forwards request by request (%s) over connections to the app that clients share, so no PROXY header could name the client (the app gets X-Forwarded-For instead); turn %s off to forward each connection's bytes after a PROXY header", n("proxy_proto"), e.ProxyProto, n("log_requests"), n("log_requests"))
	}
	if e.ProxyProto != 0 && t.network == "unix" {
		return fail("%s %d: a PROXY header names TCP addresses, and %s is a Unix socket", n("proxy_proto"), e.ProxyProto, e.To)
	}
	if e.VerboseErrors && !isHTTP {
		return fail("%s: only for an http or https URL (a %s endpoint's errors reach no page)", n("verbose_errors"), scheme)
	}
	if path := urlPath(e.URL); path != "" && !isHTTP {
		return fail("%s %s: a path routes HTTP requests, and a %s endpoint's connections carry none: drop %s", n("url"), e.URL, scheme, path)
	}
	if e.StripPrefix && urlPath(e.URL) == "" {
		return fail("%s: needs a url with a path to strip, as in http://app.example.com/api", n("strip_prefix"))
	}
	if e.HostHeader != "" && !e.httpMode() {
		return fail("%s: only for an http or https URL forwarded request by request (%s)", n("host_header"), n("log_requests"))
	}
	if scheme == "tls" && t.tls {
		return fail("%s %s: a tls endpoint passes the client's own TLS through to the app: give the app's address as host:port", n("to"), e.To)
	}
	if (e.ToCA != "" || e.ToServerName != "") && !t.tls {
		return fail("%s and %s check the certificate of an app that speaks TLS: give %s as https://host:port", n("to_ca"), n("to_server_name"), n("to"))
	}
	if t.tls {
		// The app's certificate is checked, always: against the system's
		// roots, or to_ca's. There is no way to skip the check here.
		e.toTLS = &tls.Config{ServerName: e.ToServerName, MinVersion: tls.VersionTLS12}
		if e.ToCA != "" {
			roots, err := readCA(e.ToCA, readFile)
			if err != nil {
				return fail("%s: %v", n("to_ca"), err)
			}
			e.toTLS.RootCAs = roots
		}
	}
	if e.HealthCheck != nil {
		if e.health, err = e.healthCheck(e.HealthCheck, fail); err != nil {
			return err
		}
	}
	if e.Policy != nil {
		err := e.Policy.Validate(scheme)
		if err == nil {
			err = checkRules(scheme, e.Policy)
		}
		if err != nil {
			if e.flags {
				return fmt.Errorf("traffic policy for a %s URL: %w", scheme, err)
			}
			return fmt.Errorf("%s: traffic policy for a %s URL: %w", e.where, scheme, err)
		}
	}
	return nil
}

// globals are the settings of the session, from the flags and the file.
type globals struct {
	edges     []string
	token     string
	proxy     string
	proxyCA   string
	edgeCA    string
	plaintext bool
	wait      time.Duration
	heartbeat time.Duration // zero: agent.Client's default
	metrics   string
	inspect   string
	state     string
	stateSet  bool // -state or state given: "" keeps none
}

// fromFile reads the settings of a -config file into g and returns its
// endpoints, each with the defaults of the endpoint flags where the file
// gives no value.
func (g *globals) fromFile(f *yamlcfg.File) ([]endpointSpec, error) {
	var fc fileConfig
	if err := f.Decode(f.Root, "", &fc); err != nil {
		return nil, err
	}
	if len(fc.Edge) > 0 {
		g.edges = nil
		for _, e := range fc.Edge {
			list, err := parseEdges(e)
			if err != nil {
				return nil, fmt.Errorf("%s: edge: %v", f.Name, err)
			}
			g.edges = append(g.edges, list...)
		}
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&g.token, fc.Token)
	set(&g.proxy, fc.Proxy)
	set(&g.proxyCA, fc.ProxyCA)
	set(&g.edgeCA, fc.EdgeCA)
	set(&g.metrics, fc.Metrics)
	set(&g.inspect, fc.Inspect)
	if fc.Plaintext != nil {
		g.plaintext = *fc.Plaintext
	}
	if fc.State != nil {
		g.state, g.stateSet = *fc.State, true
	}
	if fc.Wait != "" {
		d, err := time.ParseDuration(fc.Wait)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%s: wait %q: want a duration such as 30s or 5m, or 0 for good", f.Name, fc.Wait)
		}
		g.wait = d
	}
	if fc.Heartbeat != "" {
		d, err := time.ParseDuration(fc.Heartbeat)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%s: heartbeat_interval %q: want a duration such as 30s", f.Name, fc.Heartbeat)
		}
		g.heartbeat = d
	}
	if f.Root == nil || len(fc.Endpoints) == 0 {
		return nil, fmt.Errorf("%s: no endpoints: list them under endpoints, each with url and to", f.Name)
	}
	var specs []endpointSpec
	for i, fe := range fc.Endpoints {
		node := endpointNode(f.Root, i)
		pol, err := f.Policy(&fe.Policy)
		if err != nil {
			return nil, err
		}
		spec := endpointSpec{
			URL: fe.URL, To: fe.To, ToCA: fe.ToCA, ToServerName: fe.ToServerName, HostHeader: fe.HostHeader,
			AppProtocol: fe.AppProtocol, LogRequests: true, Pool: fe.Pool, ProxyProto: fe.ProxyProto, Policy: pol, VerboseErrors: fe.VerboseErrors, HealthCheck: fe.HealthCheck,
			where: fmt.Sprintf("%s:%d: endpoint %d", f.Name, node.Line, i+1),
		}
		spec.StripPrefix = fe.StripPrefix
		if fe.LogRequests != nil {
			spec.LogRequests = *fe.LogRequests
		}
		if j := slices.IndexFunc(specs, func(o endpointSpec) bool { return sameURL(o.URL, spec.URL) }); j >= 0 {
			return nil, fmt.Errorf("%s: url %s is endpoint %d's already (line %d): each url once", spec.where, spec.URL, j+1, endpointNode(f.Root, j).Line)
		}
		// Two endpoints of random URLs to one app would share their
		// record in the state file, and a reload could not tell them apart.
		if j := slices.IndexFunc(specs, func(o endpointSpec) bool { return o.stateKey() == spec.stateKey() }); j >= 0 {
			return nil, fmt.Errorf("%s: url %q and to %q are endpoint %d's already (line %d): two endpoints of random URLs need apps of their own", spec.where, spec.URL, spec.To, j+1, endpointNode(f.Root, j).Line)
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// sameURL reports whether two endpoints' URLs, as written, ask for the
// same name (or port) and path: "app", "http://app" and "HTTP://App."
// are one, "http://app/api" and "http://app/api/" another (a path's case
// matters); URLs that ask for a random name or any port ("", "http://",
// "tcp://") are none's.
func sameURL(a, b string) bool {
	norm := func(u string) string {
		scheme, rest, ok := strings.Cut(u, "://")
		if !ok {
			scheme, rest = "http", u
		}
		host, path := rest, ""
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			host, path = rest[:i], urlPath(u)
		}
		host = strings.TrimSuffix(strings.ToLower(host), ".")
		if host == "" {
			return "" // a random name, or any port
		}
		scheme = strings.ToLower(scheme)
		if scheme != "tcp" {
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h // the edge's ports apply
			}
		}
		return scheme + "://" + host + path
	}
	na := norm(a)
	return na != "" && na == norm(b)
}

// urlPath returns the path of an endpoint's URL as the edge keeps it
// ("/api" for "http://app/api/"), "" for none; a path the edge would
// refuse as it is written, so that the agent says what is wrong with it.
func urlPath(u string) string {
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		rest = u
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return ""
	}
	rest = rest[i:]
	if j := strings.IndexAny(rest, "?#"); j >= 0 {
		rest = rest[:j]
	}
	if p, ok := router.NormalisePath(rest); ok {
		return p
	}
	return rest
}

// endpointNode returns the node of the endpoint i of the file's root.
func endpointNode(root *yaml.Node, i int) *yaml.Node {
	for j := 0; j+1 < len(root.Content); j += 2 {
		if root.Content[j].Value == "endpoints" && i < len(root.Content[j+1].Content) {
			return root.Content[j+1].Content[i]
		}
	}
	return root
}

// errNoEndpoint is a command line that names nothing to expose.
var errNoEndpoint = errors.New("nothing to expose: give a port, as in 'tunnelkit http 3000', or -url and -to, or -config FILE")
