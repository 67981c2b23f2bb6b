package agent_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent"
)

// TestProxyFromEnvironmentChoice checks which proxy the environment names
// for an edge: HTTPS_PROXY before ALL_PROXY, the lower-case https_proxy and
// no_proxy first (as net/http), the upper-case ALL_PROXY first (as
// x/net/proxy), HTTP_PROXY ignored, NO_PROXY's forms, loopback never
// proxied.
func TestProxyFromEnvironmentChoice(t *testing.T) {
	const edge = "edge.example.com:7000"
	for _, tc := range []struct {
		name string
		env  map[string]string
		edge string
		want string // the proxy URL; "": none
	}{
		{"none", nil, edge, ""},
		{"HTTPS_PROXY", map[string]string{"HTTPS_PROXY": "http://proxy:3128"}, edge, "http://proxy:3128"},
		{"https_proxy first", map[string]string{"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1"}, edge, "http://lower:1"},
		{"ALL_PROXY", map[string]string{"ALL_PROXY": "socks5://u:p@socks:1080"}, edge, "socks5://u:p@socks:1080"},
		{"ALL_PROXY first", map[string]string{"ALL_PROXY": "socks5://upper:1", "all_proxy": "socks5://lower:1"}, edge, "socks5://upper:1"},
		{"HTTPS_PROXY before ALL_PROXY", map[string]string{"HTTPS_PROXY": "https://proxy:443", "ALL_PROXY": "socks5://socks:1080"}, edge, "https://proxy:443"},
		{"HTTP_PROXY is for http URLs", map[string]string{"HTTP_PROXY": "http://proxy:3128"}, edge, ""},
		{"no scheme is http", map[string]string{"HTTPS_PROXY": "proxy:3128"}, edge, "http://proxy:3128"},
		{"NO_PROXY the name", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "other.test, edge.example.com"}, edge, ""},
		{"NO_PROXY the domain", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "example.com"}, edge, ""},
		{"NO_PROXY subdomains", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".example.com"}, edge, ""},
		{"NO_PROXY subdomains only", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".example.com"}, "example.com:7000", "http://proxy:3128"},
		{"NO_PROXY another port", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "edge.example.com:7001"}, edge, "http://proxy:3128"},
		{"NO_PROXY the port", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "edge.example.com:7000"}, edge, ""},
		{"NO_PROXY CIDR", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8"}, "10.1.2.3:7000", ""},
		{"NO_PROXY outside the CIDR", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8"}, "192.0.2.1:7000", "http://proxy:3128"},
		{"NO_PROXY *", map[string]string{"ALL_PROXY": "socks5://socks:1080", "NO_PROXY": "*"}, edge, ""},
		{"no_proxy first", map[string]string{"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "edge.example.com", "NO_PROXY": "other.test"}, edge, ""},
		{"loopback", map[string]string{"HTTPS_PROXY": "http://proxy:3128"}, "127.0.0.1:7000", ""},
		{"localhost", map[string]string{"HTTPS_PROXY": "http://proxy:3128"}, "localhost:7000", ""},
		{"IPv6 loopback", map[string]string{"HTTPS_PROXY": "http://proxy:3128"}, "[::1]:7000", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearProxyEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			u, err := agent.ProxyFromEnvironment(tc.edge)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if u != nil {
				got = u.String()
			}
			if got != tc.want {
				t.Errorf("ProxyFromEnvironment(%q) = %q, want %q", tc.edge, got, tc.want)
			}
		})
	}

	t.Run("bad value", func(t *testing.T) {
		clearProxyEnv(t)
		t.Setenv("HTTPS_PROXY", "http://agent:s3cret@proxy:bad")
		_, err := agent.ProxyFromEnvironment(edge)
		if err == nil || !strings.Contains(err.Error(), "HTTPS_PROXY") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %v: want one naming HTTPS_PROXY, without the password", err)
		}
		// A Client says so, with ErrProxy.
		c := &agent.Client{Addrs: []string{edge}}
		defer c.Close()
		_, err = c.Listen(t.Context(), "http://app")
		if !errors.Is(err, agent.ErrProxy) || !strings.Contains(err.Error(), "HTTPS_PROXY") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Listen: %v: want ErrProxy, naming HTTPS_PROXY, without the password", err)
		}
	})
}
