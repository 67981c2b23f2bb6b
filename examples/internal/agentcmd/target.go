package agentcmd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// target is where an endpoint's connections go: what -to and an
// endpoint's to say.
type target struct {
	network string // "tcp" or "unix"
	addr    string // host:port, or the socket's path
	tls     bool   // the app speaks TLS (https://)
}

// targetForms says what a target may be.
const targetForms = "a port (3000), host:port, http://host:port, https://host:port (an app that speaks TLS) or unix:/path"

// parseTarget reads what people type for the app: a port alone (on
// 127.0.0.1), host:port, http://host:port (port 80 by default),
// https://host:port (TLS to the app, port 443 by default) or unix:/path (a
// Unix socket).
func parseTarget(s string) (target, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) (target, error) {
		return target{}, fmt.Errorf("%q: %s; want %s", s, why, targetForms)
	}
	if s == "" {
		return bad("empty")
	}
	if isPort(s) {
		return target{network: "tcp", addr: net.JoinHostPort("127.0.0.1", s)}, nil
	}
	if _, err := strconv.Atoi(s); err == nil {
		return bad("a port is a number from 1 to 65535")
	}
	if path, ok := strings.CutPrefix(s, "unix:"); ok {
		path = strings.TrimPrefix(path, "//")
		if !strings.HasPrefix(path, "/") {
			return bad("a Unix socket's path is absolute")
		}
		return target{network: "unix", addr: path}, nil
	}
	scheme, rest, hasScheme := strings.Cut(s, "://")
	if !hasScheme {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			var ae *net.AddrError
			if errors.As(err, &ae) && strings.Contains(ae.Err, "missing port") {
				return bad("no port")
			}
			return bad("not host:port")
		}
		if !isPort(port) {
			return bad(fmt.Sprintf("port %q is not a number from 1 to 65535", port))
		}
		if host == "" {
			host = "127.0.0.1"
		}
		return target{network: "tcp", addr: net.JoinHostPort(host, port)}, nil
	}
	t := target{network: "tcp"}
	port := ""
	switch strings.ToLower(scheme) {
	case "http":
		port = "80"
	case "https":
		port, t.tls = "443", true
	default:
		return bad(fmt.Sprintf("scheme %q", scheme))
	}
	u, err := url.Parse("http://" + rest)
	if err != nil || u.Hostname() == "" {
		return bad("no host")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
		return bad("an app's address has no path, query or user: the requests keep theirs")
	}
	if p := u.Port(); p != "" {
		if !isPort(p) {
			return bad(fmt.Sprintf("port %q is not a number from 1 to 65535", p))
		}
		port = p
	}
	t.addr = net.JoinHostPort(u.Hostname(), port)
	return t, nil
}

// isPort reports whether s is a port number, 1 to 65535.
func isPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == s
}

// String returns the target as the logs show it.
func (t target) String() string {
	switch {
	case t.network == "unix":
		return "unix:" + t.addr
	case t.tls:
		return "https://" + t.addr
	}
	return t.addr
}

// hostHeader returns the Host the app gets for the rule rule: "" keeps the
// client's, "rewrite" is the app's own address (host:port; localhost for a
// Unix socket), anything else is that value.
func (t target) hostHeader(rule string) string {
	switch rule {
	case "":
		return ""
	case "rewrite":
		if t.network == "unix" {
			return "localhost"
		}
		return t.addr
	}
	return rule
}
