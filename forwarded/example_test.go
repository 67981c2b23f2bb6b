package forwarded_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"

	"github.com/tunnelkit/tunnelkit/forwarded"
)

// printForwarding prints the forwarding headers of h and nothing else.
func printForwarding(h http.Header) {
	for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded"} {
		for _, v := range h[k] {
			fmt.Printf("%s: %s\n", k, v)
		}
	}
}

func ExampleAppend() {
	// A request that crossed a CDN, which wrote X-Forwarded-For on two lines.
	h := http.Header{}
	h.Add("X-Forwarded-For", "198.51.100.10")
	h.Add("X-Forwarded-For", "203.0.113.5")
	h.Add("X-Forwarded-Proto", "https")

	forwarded.Append(h, forwarded.Hop{
		For:   netip.MustParseAddrPort("[::ffff:192.0.2.60]:4711"), // written as IPv4, no port
		Proto: "https",
		Host:  "app.example.com",
	})
	printForwarding(h)
	// Output:
	// X-Forwarded-For: 198.51.100.10, 203.0.113.5, 192.0.2.60
	// X-Forwarded-Proto: https, https
	// X-Forwarded-Host: app.example.com
}

func ExampleOptions_Append() {
	opts := &forwarded.Options{
		XForwardedProto: forwarded.PolicyReplace, // for an app that reads the first value
		Forwarded:       forwarded.PolicyAppend,
		TrustedPeers:    []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	}
	claims := func() http.Header {
		return http.Header{
			"X-Forwarded-For":   {"198.51.100.10"},
			"X-Forwarded-Proto": {"https"},
			"Forwarded":         {"for=198.51.100.10;proto=https"},
		}
	}

	fmt.Println("from the load balancer, a trusted peer:")
	h := claims()
	opts.Append(h, forwarded.Hop{For: netip.MustParseAddrPort("10.1.2.3:40000"), Proto: "http", Host: "app.example.com"})
	printForwarding(h)

	fmt.Println("from anyone else:")
	h = claims()
	opts.Append(h, forwarded.Hop{For: netip.MustParseAddrPort("[2001:db8::1]:4711"), Proto: "http", Host: "app.example.com"})
	printForwarding(h)
	// Output:
	// from the load balancer, a trusted peer:
	// X-Forwarded-For: 198.51.100.10, 10.1.2.3
	// X-Forwarded-Proto: http
	// X-Forwarded-Host: app.example.com
	// Forwarded: for=198.51.100.10;proto=https, for="10.1.2.3:40000";proto=http;host=app.example.com
	// from anyone else:
	// X-Forwarded-For: 2001:db8::1
	// X-Forwarded-Proto: http
	// X-Forwarded-Host: app.example.com
	// Forwarded: for="[2001:db8::1]:4711";proto=http;host=app.example.com
}

// exampleUpstream starts an app that prints the Host and forwarding headers
// it receives.
func exampleUpstream() (*url.URL, func()) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("Host:", r.Host)
		printForwarding(r.Header)
	}))
	u, err := url.Parse(srv.URL)
	if err != nil {
		log.Fatal(err)
	}
	return u, srv.Close
}

// exampleGet sends a GET for app.example.com to proxyURL, claiming to come
// from 198.51.100.10.
func exampleGet(proxyURL string) {
	req, err := http.NewRequest(http.MethodGet, proxyURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	req.Host = "app.example.com"
	req.Header.Set("X-Forwarded-For", "198.51.100.10")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
}

func ExampleRewrite() {
	upstream, stop := exampleUpstream()
	defer stop()

	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			forwarded.Rewrite(pr, forwarded.HopFromRequest(pr.In))
		},
	}
	front := httptest.NewServer(proxy)
	defer front.Close()

	exampleGet(front.URL)
	// Output:
	// Host: app.example.com
	// X-Forwarded-For: 198.51.100.10, 127.0.0.1
	// X-Forwarded-Proto: http
	// X-Forwarded-Host: app.example.com
}

// Over a tunnel, the proxy's peer is the tunnel: the client address comes
// from the tunnel, and the upstream wants its own Host.
func ExampleOptions_Rewrite() {
	upstream, stop := exampleUpstream()
	defer stop()

	// What the tunnel says about the client of each request.
	clientAddr := func(*http.Request) netip.AddrPort {
		return netip.MustParseAddrPort("[2001:db8::7]:55555")
	}
	opts := &forwarded.Options{
		Forwarded: forwarded.PolicyAppend,
		Host:      "localhost:3000",
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			hop := forwarded.HopFromRequest(pr.In)
			hop.For = clientAddr(pr.In)
			opts.Rewrite(pr, hop)
		},
	}
	front := httptest.NewServer(proxy)
	defer front.Close()

	exampleGet(front.URL)
	// Output:
	// Host: localhost:3000
	// X-Forwarded-For: 198.51.100.10, 2001:db8::7
	// X-Forwarded-Proto: http
	// X-Forwarded-Host: app.example.com
	// Forwarded: for="[2001:db8::7]:55555";proto=http;host=app.example.com
}
