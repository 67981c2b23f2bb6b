package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"
	"golang.org/x/net/proxy"
)

// ProxyURL returns a Client.Proxy func that sends every edge through the
// proxy at u, whatever the environment says. ProxyURL(nil) never uses a
// proxy.
func ProxyURL(u *url.URL) func(edgeAddr string) (*url.URL, error) {
	return func(string) (*url.URL, error) { return u, nil }
}

// ProxyFromEnvironment returns the proxy the environment names for the edge
// at edgeAddr ("host:port"), or nil for none, the way net/http reads the
// environment for an https URL (golang.org/x/net/http/httpproxy):
// https_proxy or HTTPS_PROXY (the lower-case name first), else ALL_PROXY or
// all_proxy (the upper-case name first, as golang.org/x/net/proxy reads
// it); a value without a scheme is an http:// proxy. no_proxy or NO_PROXY
// (the lower-case name first) lists, comma-separated, the edges to reach
// directly: names ("example.com" with its subdomains, ".example.com" its
// subdomains only), IP addresses and CIDR ranges, each optionally with a
// port, or "*" for all. An edge on loopback (localhost, 127.0.0.1, ::1) is
// never proxied, as net/http never proxies it. The environment is read at
// each call. A Client whose Proxy is nil uses it.
func ProxyFromEnvironment(edgeAddr string) (*url.URL, error) {
	name, val := getenvAny("https_proxy", "HTTPS_PROXY")
	if val == "" {
		name, val = getenvAny("ALL_PROXY", "all_proxy")
	}
	if val == "" {
		return nil, nil
	}
	val, err := checkProxyValue(val)
	if err != nil {
		return nil, fmt.Errorf("%s is not a proxy URL: %w", name, err)
	}
	_, noProxy := getenvAny("no_proxy", "NO_PROXY")
	cfg := httpproxy.Config{HTTPSProxy: val, NoProxy: noProxy}
	return cfg.ProxyFunc()(&url.URL{Scheme: "https", Host: edgeAddr})
}

// getenvAny returns the first of the environment variables names that is
// set and not empty, and its value.
func getenvAny(names ...string) (name, val string) {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return n, v
		}
	}
	return "", ""
}

// checkProxyValue checks a proxy variable's value, and returns it with
// "http://" in front when it has no scheme. Its error leaves the value out:
// it may hold a password.
func checkProxyValue(val string) (string, error) {
	if !strings.Contains(val, "://") {
		val = "http://" + val
	}
	u, err := url.Parse(val)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return "", ue.Err
	}
	if err != nil {
		return "", err
	}
	if u.Host == "" {
		return "", errors.New("no host")
	}
	return val, nil
}

// dialEdge opens the transport to the edge at addr, within ctx: directly,
// or through the proxy that Client.Proxy (nil: ProxyFromEnvironment)
// names, which DialContext dials. A direct dial's error reads "agent: dial
// edge: ..."; a proxy's wraps ErrProxy.
//
// It is the hook of Client.open for proxies.
func (c *Client) dialEdge(ctx context.Context, addr string) (net.Conn, error) {
	dial := c.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	choose := c.Proxy
	if choose == nil {
		choose = ProxyFromEnvironment
	}
	u, err := choose(addr)
	if err != nil {
		return nil, &proxyError{msg: "choosing one for the edge " + addr, err: err}
	}
	if u == nil {
		conn, err := dial(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("agent: dial edge: %w", err)
		}
		return conn, nil
	}
	conn, name, err := c.dialProxy(ctx, dial, u, addr)
	if err != nil {
		return nil, err
	}
	c.log().Info("reached the edge through a proxy", "edge", addr, "proxy", name)
	return conn, nil
}

// dialProxy opens a tunnel to the edge at addr through the proxy at u, and
// returns it with the proxy's name (scheme://host:port).
func (c *Client) dialProxy(ctx context.Context, dial dialFunc, u *url.URL, addr string) (net.Conn, string, error) {
	scheme := strings.ToLower(u.Scheme)
	var defaultPort string
	switch scheme {
	case "http":
		defaultPort = "80"
	case "https":
		defaultPort = "443"
	case "socks5", "socks5h":
		defaultPort = "1080"
	default:
		return nil, "", &proxyError{proxy: u.Scheme + "://" + u.Host, msg: "unsupported scheme (want http, https, socks5 or socks5h)"}
	}
	if u.Hostname() == "" {
		return nil, "", &proxyError{msg: scheme + " URL without a host"}
	}
	port := u.Port()
	if port == "" {
		port = defaultPort
	}
	hostport := net.JoinHostPort(u.Hostname(), port)
	p := &proxyDial{
		name:     scheme + "://" + hostport,
		hostport: hostport,
		user:     u.User,
		edge:     addr,
		dial:     dial,
	}
	var conn net.Conn
	var err error
	switch scheme {
	case "http", "https":
		var tlsHost string
		if scheme == "https" {
			tlsHost = u.Hostname()
		}
		conn, err = p.connect(ctx, c.proxyTLSConfig(tlsHost))
	default:
		conn, err = p.socks5(ctx)
	}
	return conn, p.name, err
}

// proxyDial is one attempt at a tunnel through a proxy.
type proxyDial struct {
	name     string        // scheme://host:port, for errors and logs
	hostport string        // the proxy's address
	user     *url.Userinfo // credentials, or nil
	edge     string        // the edge's address, the tunnel's end
	dial     dialFunc      // dials the proxy
}

// fail returns the error of the attempt: what the proxy did (msg), and why
// (cause, which may be nil). When ctx ended first, its cause is the cause.
func (p *proxyDial) fail(ctx context.Context, msg string, cause error) error {
	if d, ok := ctx.Deadline(); ok && errors.Is(cause, os.ErrDeadlineExceeded) && !time.Now().Before(d) {
		// The SOCKS client sets ctx's deadline on the conn, which may
		// expire just before ctx does.
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		return &proxyError{proxy: p.name, msg: "no answer in time to open the tunnel to the edge " + p.edge, err: context.Cause(ctx), passing: true}
	}
	return &proxyError{proxy: p.name, msg: msg, err: cause}
}

// unreachable is fail for a failure that may pass, as an edge's that
// cannot be reached: the proxy cannot be reached, or cannot reach the
// edge.
func (p *proxyDial) unreachable(ctx context.Context, msg string, cause error) error {
	err := p.fail(ctx, msg, cause)
	err.(*proxyError).passing = true
	return err
}

// socks5 opens the tunnel through a SOCKS5 proxy, with username and
// password authentication when the URL has a user. The proxy resolves the
// edge's name, for socks5 and socks5h alike (as net/http does).
func (p *proxyDial) socks5(ctx context.Context) (net.Conn, error) {
	var auth *proxy.Auth
	if p.user != nil {
		pw, _ := p.user.Password()
		auth = &proxy.Auth{User: p.user.Username(), Password: pw}
	}
	var dialErr error
	forward := dialFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := p.dial(ctx, network, addr)
		dialErr = err
		return conn, err
	})
	d, err := proxy.SOCKS5("tcp", p.hostport, auth, forward)
	if err != nil {
		return nil, p.fail(ctx, "setting up SOCKS5", err)
	}
	cd, ok := d.(proxy.ContextDialer)
	if !ok {
		return nil, p.fail(ctx, "setting up SOCKS5", errors.New("no DialContext"))
	}
	conn, err := cd.DialContext(ctx, "tcp", p.edge)
	if err == nil {
		return conn, nil
	}
	if dialErr != nil {
		return nil, p.unreachable(ctx, "cannot connect to it", dialErr)
	}
	// The SOCKS client wraps its error in a net.OpError that names the
	// path; the message says it already.
	if oe := (*net.OpError)(nil); errors.As(err, &oe) {
		err = oe.Err
	}
	if closedEarly(err) {
		return nil, p.fail(ctx, "closed the connection during the SOCKS5 handshake for the edge "+p.edge, err)
	}
	return nil, p.fail(ctx, "SOCKS5 handshake for the edge "+p.edge+" failed", err)
}

// proxyError is the failure of a proxy; it wraps ErrProxy and its cause.
type proxyError struct {
	proxy   string // scheme://host:port, never the credentials; empty when unknown
	msg     string // what happened
	err     error  // the cause, or nil
	passing bool   // waiting may cure it: the proxy, or the edge beyond it, cannot be reached
}

func (e *proxyError) Error() string {
	var b strings.Builder
	b.WriteString("agent: proxy")
	if e.proxy != "" {
		b.WriteString(" ")
		b.WriteString(e.proxy)
	}
	b.WriteString(": ")
	b.WriteString(e.msg)
	if e.err != nil {
		b.WriteString(": ")
		b.WriteString(e.err.Error())
	}
	return b.String()
}

func (e *proxyError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrProxy}
	}
	return []error{ErrProxy, e.err}
}

// dialFunc is a Client.DialContext, and the proxy.Dialer and
// proxy.ContextDialer that golang.org/x/net/proxy dials SOCKS proxies with.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (f dialFunc) Dial(network, addr string) (net.Conn, error) {
	return f(context.Background(), network, addr)
}

func (f dialFunc) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return f(ctx, network, addr)
}
