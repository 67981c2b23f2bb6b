package forwarded_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/forwarded"
)

// seen is what the upstream received.
type seen struct {
	header http.Header
	host   string
}

// startUpstream starts an HTTP server on loopback that reports each
// request it receives.
func startUpstream(t *testing.T) (*url.URL, <-chan seen) {
	t.Helper()
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Clone(), r.Host}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u, got
}

// startProxy starts an httputil.ReverseProxy on loopback (over TLS if
// tlsOn) whose Rewrite calls SetURL(upstream), then step.
func startProxy(t *testing.T, upstream *url.URL, tlsOn bool, step func(*httputil.ProxyRequest)) *httptest.Server {
	t.Helper()
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream)
		step(pr)
	}}
	var srv *httptest.Server
	if tlsOn {
		srv = httptest.NewTLSServer(proxy)
	} else {
		srv = httptest.NewServer(proxy)
	}
	t.Cleanup(srv.Close)
	return srv
}

// send sends a GET for host with header to srv, and returns the client's
// local address (the proxy's peer).
func send(t *testing.T, srv *httptest.Server, host string, header http.Header) netip.AddrPort {
	t.Helper()
	var local netip.AddrPort
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := new(net.Dialer).DialContext(ctx, network, addr)
		if err == nil {
			local = c.LocalAddr().(*net.TCPAddr).AddrPort()
		}
		return c, err
	}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header = header.Clone()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %s", resp.Status)
	}
	return local
}

// forwardingHeaders returns the forwarding headers of h, each present
// one with all its lines.
func forwardingHeaders(h http.Header) http.Header {
	out := http.Header{}
	for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded"} {
		if v, ok := h[k]; ok {
			out[k] = v
		}
	}
	return out
}

func TestReverseProxy(t *testing.T) {
	spoofing := http.Header{
		"X-Forwarded-For":   {"198.51.100.10"},
		"X-Forwarded-Proto": {"https"},
		"X-Forwarded-Host":  {"evil.example"},
		"Forwarded":         {"for=198.51.100.10;proto=https;host=evil.example"},
	}
	// tunnelHop takes the client address from elsewhere than RemoteAddr.
	tunnelHop := func(pr *httputil.ProxyRequest) forwarded.Hop {
		hop := forwarded.HopFromRequest(pr.In)
		hop.For = netip.MustParseAddrPort("203.0.113.7:5555")
		return hop
	}
	for _, c := range []struct {
		name     string
		opts     *forwarded.Options
		hop      func(*httputil.ProxyRequest) forwarded.Hop // nil: HopFromRequest(pr.In)
		tls      bool
		header   http.Header
		wantHost string // "" means "app.example.com"
		// want is the forwarding headers the upstream sees; "PEER" in a
		// Forwarded value stands for the client's ip:port.
		want http.Header
	}{{
		name:   "client sends nothing",
		header: http.Header{},
		want: http.Header{
			"X-Forwarded-For":   {"127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}, {
		name:   "client sends X-Forwarded-For",
		header: http.Header{"X-Forwarded-For": {"198.51.100.10"}},
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}, {
		name:   "client sends every forwarding header",
		header: spoofing,
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 127.0.0.1"},
			"X-Forwarded-Proto": {"https, http"},
			"X-Forwarded-Host":  {"evil.example, app.example.com"},
		},
	}, {
		name:   "several lines folded",
		header: http.Header{"X-Forwarded-For": {"198.51.100.10", "", "203.0.113.5"}},
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.5, 127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}, {
		name: "client lists X-Forwarded-For in Connection",
		header: http.Header{
			"Connection":        {"X-Forwarded-For"},
			"X-Forwarded-For":   {"198.51.100.10"},
			"X-Forwarded-Proto": {"https"},
		},
		want: http.Header{
			"X-Forwarded-For":   {"127.0.0.1"},
			"X-Forwarded-Proto": {"https, http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}, {
		name: "client lists every forwarding header in Connection",
		opts: &forwarded.Options{Forwarded: forwarded.PolicyAppend},
		header: func() http.Header {
			h := spoofing.Clone()
			h["Connection"] = []string{"x-forwarded-for, X-Forwarded-Proto", "X-FORWARDED-HOST, Forwarded"}
			return h
		}(),
		want: http.Header{
			"X-Forwarded-For":   {"127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
			"Forwarded":         {`for="PEER";proto=http;host=app.example.com`},
		},
	}, {
		name: "replace policies, Forwarded, Host replaced",
		opts: &forwarded.Options{
			XForwardedProto: forwarded.PolicyReplace,
			XForwardedHost:  forwarded.PolicyReplace,
			Forwarded:       forwarded.PolicyAppend,
			Host:            "localhost:3000",
		},
		header:   spoofing,
		wantHost: "localhost:3000",
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
			"Forwarded":         {`for=198.51.100.10;proto=https;host=evil.example, for="PEER";proto=http;host=app.example.com`},
		},
	}, {
		name:   "strip policies",
		opts:   &forwarded.Options{XForwardedFor: forwarded.PolicyStrip, XForwardedProto: forwarded.PolicyStrip, XForwardedHost: forwarded.PolicyStrip},
		header: spoofing,
		want:   http.Header{},
	}, {
		name:   "untrusted peer",
		opts:   &forwarded.Options{TrustedPeers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Forwarded: forwarded.PolicyAppend},
		header: spoofing,
		want: http.Header{
			"X-Forwarded-For":   {"127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
			"Forwarded":         {`for="PEER";proto=http;host=app.example.com`},
		},
	}, {
		name: "trusted peer, keep policies",
		opts: &forwarded.Options{
			TrustedPeers:    []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			XForwardedProto: forwarded.PolicyKeep,
			XForwardedHost:  forwarded.PolicyKeep,
		},
		header: spoofing,
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 127.0.0.1"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"evil.example"},
		},
	}, {
		name:   "client address from the tunnel",
		hop:    tunnelHop,
		header: http.Header{"X-Forwarded-For": {"198.51.100.10"}},
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 203.0.113.7"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}, {
		name:   "over TLS",
		tls:    true,
		header: http.Header{"X-Forwarded-For": {"198.51.100.10"}, "X-Forwarded-Proto": {"http"}},
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 127.0.0.1"},
			"X-Forwarded-Proto": {"http, https"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			upstream, got := startUpstream(t)
			srv := startProxy(t, upstream, c.tls, func(pr *httputil.ProxyRequest) {
				hop := forwarded.HopFromRequest(pr.In)
				if c.hop != nil {
					hop = c.hop(pr)
				}
				in := pr.In.Header.Clone()
				if c.opts == nil {
					forwarded.Rewrite(pr, hop)
				} else {
					c.opts.Rewrite(pr, hop)
				}
				if !reflect.DeepEqual(pr.In.Header, in) {
					t.Errorf("Rewrite modified In:%s\nwas%s", dump(pr.In.Header), dump(in))
				}
			})
			peer := send(t, srv, "app.example.com", c.header)
			s := <-got

			want := c.want.Clone()
			for i, v := range want["Forwarded"] {
				want["Forwarded"][i] = strings.ReplaceAll(v, "PEER", peer.String())
			}
			if h := forwardingHeaders(s.header); !reflect.DeepEqual(h, want) {
				t.Errorf("upstream saw%s\nwant%s", dump(h), dump(want))
			}
			wantHost := c.wantHost
			if wantHost == "" {
				wantHost = "app.example.com"
			}
			if s.host != wantHost {
				t.Errorf("upstream saw Host %q, want %q", s.host, wantHost)
			}
		})
	}
}

func TestReverseProxyIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	upstream, got := startUpstream(t)
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream)
		(&forwarded.Options{Forwarded: forwarded.PolicyAppend}).Rewrite(pr, forwarded.HopFromRequest(pr.In))
	}}
	srv := httptest.NewUnstartedServer(proxy)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)

	peer := send(t, srv, "app.example.com", http.Header{"X-Forwarded-For": {"198.51.100.10"}})
	s := <-got
	want := http.Header{
		"X-Forwarded-For":   {"198.51.100.10, ::1"},
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {"app.example.com"},
		"Forwarded":         {`for="` + peer.String() + `";proto=http;host=app.example.com`},
	}
	if h := forwardingHeaders(s.header); !reflect.DeepEqual(h, want) {
		t.Errorf("upstream saw%s\nwant%s", dump(h), dump(want))
	}
}

// TestDirectorIsNotEnough checks what the package documentation says of
// httputil.ReverseProxy's Director: neither way of appending there adds
// exactly one hop.
func TestDirectorIsNotEnough(t *testing.T) {
	upstream, got := startUpstream(t)
	director := func(nilAfter bool) func(*http.Request) {
		return func(r *http.Request) {
			r.URL.Scheme, r.URL.Host = upstream.Scheme, upstream.Host
			forwarded.Append(r.Header, forwarded.HopFromRequest(r))
			if nilAfter {
				r.Header["X-Forwarded-For"] = nil
			}
		}
	}
	for _, c := range []struct {
		name     string
		nilAfter bool
		header   http.Header
		want     http.Header
	}{{
		name:   "appending in the Director reports the client twice",
		header: http.Header{"X-Forwarded-For": {"198.51.100.10"}},
		want: http.Header{
			"X-Forwarded-For":   {"198.51.100.10, 127.0.0.1, 127.0.0.1"},
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}, {
		name:     "setting X-Forwarded-For to nil sends none",
		nilAfter: true,
		header:   http.Header{"X-Forwarded-For": {"198.51.100.10"}},
		want: http.Header{
			"X-Forwarded-Proto": {"http"},
			"X-Forwarded-Host":  {"app.example.com"},
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			//lint:ignore SA1019 this test shows why a Director cannot be made right
			srv := httptest.NewServer(&httputil.ReverseProxy{Director: director(c.nilAfter)})
			t.Cleanup(srv.Close)
			send(t, srv, "app.example.com", c.header)
			if h := forwardingHeaders((<-got).header); !reflect.DeepEqual(h, c.want) {
				t.Errorf("upstream saw%s\nwant%s", dump(h), dump(c.want))
			}
		})
	}
}

func TestRewriteHost(t *testing.T) {
	upstream := &url.URL{Scheme: "http", Host: "127.0.0.1:3000"}
	newPR := func() *httputil.ProxyRequest {
		in := httptest.NewRequest(http.MethodGet, "http://app.example.com/x", nil)
		out := in.Clone(in.Context())
		pr := &httputil.ProxyRequest{In: in, Out: out}
		pr.SetURL(upstream)
		return pr
	}
	for _, c := range []struct {
		name string
		opts *forwarded.Options
		want string
	}{
		{"nil options preserve Host", nil, "app.example.com"},
		{"zero options preserve Host", &forwarded.Options{}, "app.example.com"},
		{"Host option replaces it", &forwarded.Options{Host: "localhost:3000"}, "localhost:3000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr := newPR()
			c.opts.Rewrite(pr, forwarded.HopFromRequest(pr.In))
			if pr.Out.Host != c.want {
				t.Errorf("Out.Host %q, want %q", pr.Out.Host, c.want)
			}
			if got := pr.Out.Header.Get("X-Forwarded-Host"); got != "app.example.com" {
				t.Errorf("X-Forwarded-Host %q, want the client's Host", got)
			}
		})
	}
}

func TestRewriteReplacesOutHeaders(t *testing.T) {
	in := httptest.NewRequest(http.MethodGet, "http://app.example.com/", nil)
	in.Header["X-Forwarded-For"] = []string{"198.51.100.10"}
	pr := &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
	pr.Out.Header["X-Forwarded-For"] = []string{"203.0.113.99"} // set before, say by SetXForwarded
	pr.Out.Header["X-Forwarded-Proto"] = []string{"ftp"}
	pr.Out.Header["Forwarded"] = []string{"for=203.0.113.99"}
	forwarded.Rewrite(pr, forwarded.HopFromRequest(pr.In))
	want := http.Header{
		"X-Forwarded-For":   {"198.51.100.10, 192.0.2.1"}, // httptest.NewRequest's RemoteAddr
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {"app.example.com"},
	}
	if h := forwardingHeaders(pr.Out.Header); !reflect.DeepEqual(h, want) {
		t.Errorf("Out has%s\nwant%s", dump(h), dump(want))
	}
}

func TestHopFromRequest(t *testing.T) {
	for _, c := range []struct {
		remoteAddr string
		tls        bool
		want       forwarded.Hop
	}{
		{"192.0.2.60:4711", false, forwarded.Hop{For: netip.MustParseAddrPort("192.0.2.60:4711"), Proto: "http", Host: "example.com"}},
		{"[2001:db8::1]:443", true, forwarded.Hop{For: netip.MustParseAddrPort("[2001:db8::1]:443"), Proto: "https", Host: "example.com"}},
		{"[fe80::1%eth0]:80", false, forwarded.Hop{For: netip.MustParseAddrPort("[fe80::1%eth0]:80"), Proto: "http", Host: "example.com"}},
		{"192.0.2.60", false, forwarded.Hop{For: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.60"), 0), Proto: "http", Host: "example.com"}},
		{"@", false, forwarded.Hop{Proto: "http", Host: "example.com"}},
		{"", false, forwarded.Hop{Proto: "http", Host: "example.com"}},
	} {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.RemoteAddr = c.remoteAddr
		if c.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := forwarded.HopFromRequest(r); got != c.want {
			t.Errorf("RemoteAddr %q, TLS %v: %+v, want %+v", c.remoteAddr, c.tls, got, c.want)
		}
	}
}
