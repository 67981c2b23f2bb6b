package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"reflect"
	"testing"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
)

// bindEdge is an edge that grants every bind and hands each one to the
// test, as the agent sent it.
func bindEdge(t *testing.T) (addr string, binds <-chan wire.Bind) {
	t.Helper()
	ch := make(chan wire.Bind, 8)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = testnet.Serve(t, ln, func(c net.Conn) {
		defer c.Close()
		window, err := wire.ReadPreamble(c)
		if err != nil {
			return
		}
		window = wire.ClampWindow(int(window))
		if wire.WritePreamble(c, window) != nil {
			return
		}
		sess := muxado.Server(c, wire.MuxConfig(window))
		defer sess.Close()
		for {
			st, err := sess.Accept()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				var typ [1]byte
				if _, err := io.ReadFull(st, typ[:]); err != nil {
					return
				}
				if wire.StreamType(typ[0]) != wire.StreamControl {
					io.Copy(st, st) // heartbeats: echoed
					return
				}
				var req wire.Request
				if wire.ReadMessage(st, &req) != nil {
					return
				}
				var resp wire.Response
				switch req.Op {
				case wire.OpHello:
					resp.HelloResp = &wire.HelloResp{Version: wire.Version, SessionID: "s1"}
				case wire.OpBind:
					ch <- *req.Bind
					resp.BindResp = &wire.BindResp{TunnelID: "t1", URL: req.Bind.Proto + "://app.example.test"}
				}
				wire.WriteMessage(st, nil, resp)
			}()
		}
	})
	return addr, ch
}

func TestListenSendsPolicy(t *testing.T) {
	addr, binds := bindEdge(t)
	spec := &policy.Spec{
		CIDRDeny:  []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		BasicAuth: &policy.BasicAuth{Credentials: []string{"ann:s3cret"}},
		RateLimit: &policy.RateLimit{Requests: 5},
	}
	c := &agent.Client{Addrs: []string{addr}}
	defer c.Close()
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "https://app", AppProtocol: "h2c", Policy: spec})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b := <-binds
	if b.Options[wire.OptPolicy] != wire.PolicyVersion || b.Options[wire.OptAppProtocol] != wire.AppProtocolH2C {
		t.Errorf("options %v; want %s=%s beside the app protocol", b.Options, wire.OptPolicy, wire.PolicyVersion)
	}
	got, err := policy.Parse(b.Policy)
	if err != nil {
		t.Fatalf("the edge cannot parse the bind's policy: %v\n%s", err, b.Policy)
	}
	if !reflect.DeepEqual(&got, spec) {
		t.Errorf("the edge got %+v; want %+v", got, *spec)
	}

	// No policy: neither the member nor the option.
	l2, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://plain", Policy: &policy.Spec{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if b := <-binds; b.Policy != nil || b.Options != nil {
		t.Errorf("an empty policy sent %s, options %v", b.Policy, b.Options)
	}
}

// TestListenSendsVerboseErrors: Endpoint.VerboseErrors goes to the edge
// as the option verbose_errors=true, which the listener reports; an
// endpoint without it sends no option at all, which an edge that does not
// know the option would refuse.
func TestListenSendsVerboseErrors(t *testing.T) {
	addr, binds := bindEdge(t)
	c := &agent.Client{Addrs: []string{addr}}
	defer c.Close()
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "https://app", VerboseErrors: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if b := <-binds; len(b.Options) != 1 || b.Options[wire.OptVerboseErrors] != "true" || !l.VerboseErrors() {
		t.Errorf("options %v, the listener's VerboseErrors %v; want %s=true alone, true", b.Options, l.VerboseErrors(), wire.OptVerboseErrors)
	}
	l2, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://plain"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if b := <-binds; b.Options != nil || l2.VerboseErrors() {
		t.Errorf("without verbose errors: options %v, the listener's VerboseErrors %v; want none, false", b.Options, l2.VerboseErrors())
	}
}

// A policy that cannot hold on the endpoint fails before anything is sent.
func TestListenRefusesBadPolicy(t *testing.T) {
	addr, binds := bindEdge(t)
	c := &agent.Client{Addrs: []string{addr}}
	defer c.Close()
	for _, tc := range []struct {
		url  string
		spec *policy.Spec
		want error
	}{
		{"tcp://", &policy.Spec{BasicAuth: &policy.BasicAuth{Credentials: []string{"a:b"}}}, policy.ErrProtocol},
		{"http://app", &policy.Spec{OIDC: &policy.OIDC{Issuer: "https://id.example", ClientID: "c", AllowDomains: []string{"example.com"}}}, policy.ErrProtocol},
		{"http://app", &policy.Spec{RequestHeaders: &policy.Headers{Add: []string{"Host: other"}}}, policy.ErrInvalid},
		{"http://app", &policy.Spec{RateLimit: &policy.RateLimit{}}, policy.ErrInvalid},
	} {
		_, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: tc.url, Policy: tc.spec})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s with %v: %v; want %v", tc.url, tc.spec, err, tc.want)
		}
	}
	select {
	case b := <-binds:
		t.Errorf("a bad policy was sent: %+v", b)
	default:
	}
}
