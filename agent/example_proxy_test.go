package agent_test

import (
	"fmt"
	"net/url"

	"github.com/tunnelkit/tunnelkit/agent"
)

// An agent behind a proxy. Without Proxy, it follows HTTPS_PROXY,
// ALL_PROXY and NO_PROXY (agent.ProxyFromEnvironment).
func ExampleProxyURL() {
	proxy, err := url.Parse("http://user:password@proxy.example.com:3128")
	if err != nil {
		panic(err)
	}
	c := &agent.Client{
		Addrs: []string{"edge.example.com:7000"},
		Proxy: agent.ProxyURL(proxy), // whatever the environment says
	}
	defer c.Close()
	// c.Listen(ctx, "https://myapp") opens its session through the proxy,
	// with CONNECT, and TLS to the edge inside the tunnel.
	u, _ := c.Proxy(c.Addrs[0])
	fmt.Println(u.Redacted())
	// Output: http://user:xxxxx@proxy.example.com:3128
}
