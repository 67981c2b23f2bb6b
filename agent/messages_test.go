package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

// The messages of the agent's failures point at their cause: each quotes
// what the user gave and says what is wrong with it.

// TestEndpointURLMessages: an endpoint URL that is not one is quoted as
// given, with what is wrong in it, before any connection is made.
func TestEndpointURLMessages(t *testing.T) {
	c := &agent.Client{Addrs: []string{closedAddr(t)}}
	defer c.Close()
	for _, tc := range []struct{ url, want string }{
		{"http:/x", `agent: endpoint "http:/x": a scheme takes "://" after it: http://x`},
		{"https:abc", `agent: endpoint "https:abc": a scheme takes "://" after it: https://abc`},
		{"tcp//:20001", `agent: endpoint "tcp//:20001": a scheme takes "://" after it: tcp://:20001`},
		{"tls://a.example.com/path", `agent: endpoint "tls://a.example.com/path": a path ("/path") routes HTTP requests, and the traffic of a tls endpoint carries none: drop it`},
		{"tcp://:20001/x", `agent: endpoint "tcp://:20001/x": a path ("/x") routes HTTP requests, and the traffic of a tcp endpoint carries none`},
		{"abc/x?y=1", `agent: endpoint "abc/x?y=1": a query ("?y=1") has no place`},
		{"http://a?x=1", `agent: endpoint "http://a?x=1": a query ("?x=1") has no place`},
		{"http://a#top", `agent: endpoint "http://a#top": a fragment ("#top") has no place`},
		{"http://user@a", `agent: endpoint "http://user@a": credentials ("user@") have no place`},
		{"ftp://x", `agent: endpoint "ftp://x": unsupported scheme "ftp": want http, https, tls or tcp`},
		{"tls://", `agent: endpoint "tls://": a tls endpoint needs a name: tls://app.example.com`},
		{"tcp://x", `agent: endpoint "tcp://x": a tcp endpoint takes a port, not a host ("x"): want tcp:// (any port) or tcp://:PORT`},
		{"tcp://:99999", `agent: endpoint "tcp://:99999": port "99999": want 1 to 65535`},
		{"::::", `agent: endpoint "::::": `},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Listen(ctx, tc.url)
		cancel()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Listen(%q): %v\nwant an error starting %s", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "connect") {
			t.Errorf("Listen(%q) connected before it found the URL wrong: %v", tc.url, err)
		}
	}
}

// TestStripPrefixMessage: StripPrefix without a path in the URL is
// refused before any connection is made.
func TestStripPrefixMessage(t *testing.T) {
	c := &agent.Client{Addrs: []string{closedAddr(t)}}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.ListenEndpoint(ctx, agent.Endpoint{URL: "http://a/", StripPrefix: true})
	if want := `agent: endpoint "http://a/": strip prefix needs a path in the URL to strip`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("StripPrefix without a path: %v\nwant an error starting %s", err, want)
	}
}

// TestTokenMessages: an edge that wants a token says whether the agent
// sent none or a wrong one; both wrap ErrUnauthorized, the first
// ErrNoToken too.
func TestTokenMessages(t *testing.T) {
	e := startHTTPEdge(t, &edge.Server{Authenticate: func(_ context.Context, token string) (string, error) {
		if token != "s3cret" {
			return "", errors.New("unknown token")
		}
		return "alice", nil
	}})
	for _, tc := range []struct {
		token   string
		want    string
		noToken bool
	}{
		{"", "agent: unauthorized: no token was sent, and this edge admits only agents that present one", true},
		{"wrong", "agent: unauthorized: this edge refused the token", false},
	} {
		c := &agent.Client{Addrs: []string{e.agents}, Token: tc.token}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := c.Listen(ctx, "app")
		cancel()
		c.Close()
		if !errors.Is(err, agent.ErrUnauthorized) || errors.Is(err, agent.ErrNoToken) != tc.noToken || err.Error() != tc.want {
			t.Errorf("token %q: %v\nwant %s (ErrUnauthorized; ErrNoToken: %v)", tc.token, err, tc.want, tc.noToken)
		}
	}
}

// TestAnonymousPoolMessage: two agents without a token cannot share a
// pool, each being an identity of its own: the refusal says so.
func TestAnonymousPoolMessage(t *testing.T) {
	e := startHTTPEdge(t, nil)
	first := &agent.Client{Addrs: []string{e.agents}}
	defer first.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := first.ListenEndpoint(ctx, agent.Endpoint{URL: "http://shared", Pool: true}); err != nil {
		t.Fatal(err)
	}
	second := &agent.Client{Addrs: []string{e.agents}}
	defer second.Close()
	_, err := second.ListenEndpoint(ctx, agent.Endpoint{URL: "http://shared", Pool: true})
	if want := "agents without a token are each an identity of their own: to share a pool, give them the same token"; !errors.Is(err, agent.ErrNameTaken) || !strings.Contains(err.Error(), want) {
		t.Errorf("second agent of the pool: %v\nwant ErrNameTaken saying %q", err, want)
	}
}
