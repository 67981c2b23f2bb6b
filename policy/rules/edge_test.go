package rules_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/policy/rules"
)

// An edge with the engine and an agent of the library, on loopback: a bind
// whose rule the engine refuses gets bad_request naming the agent's own
// rule (the operator's come first in the combination); one that compiles
// runs, the operator's rules around the agent's; an edge without the
// engine refuses rules with expressions, saying so.
func TestRulesThroughEdge(t *testing.T) {
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	operator := policy.Operator{Policy: policy.Spec{OnHTTPRequest: []policy.Rule{{Name: "op", Actions: []policy.Action{
		{Type: policy.ActionAddHeaders, Config: []byte(`{"headers":{"X-Order":"operator"}}`)}}}}}}
	start := func(engine policy.Engine) (agentsAddr, httpAddr string) {
		agents, pub := listen(), listen()
		srv := &edge.Server{Domain: "example.test", PolicyEngine: engine, Policy: func(string) policy.Operator { return operator }}
		var wg sync.WaitGroup
		wg.Go(func() { srv.ServeAgents(agents) })
		wg.Go(func() { srv.ServeHTTPListener(pub) })
		t.Cleanup(func() { srv.Close(); wg.Wait() })
		return agents.Addr().String(), pub.Addr().String()
	}
	agents, pub := start(rules.Engine{})
	ag := &agent.Client{Addrs: []string{agents}}
	t.Cleanup(func() { ag.Close() })

	bad := &policy.Spec{OnHTTPRequest: []policy.Rule{{Name: "typo", Expressions: []string{"req.uri.path == '/'"}, Actions: []policy.Action{{Type: policy.ActionDeny}}}}}
	_, err := ag.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://bad", Policy: bad})
	if err == nil || !strings.Contains(err.Error(), `on_http_request[0] "typo": expressions[0]: column 1: undeclared reference to 'req'`) {
		t.Errorf("a bind with a bad rule: %v", err)
	}

	good := &policy.Spec{OnHTTPRequest: []policy.Rule{{Name: "agent", Expressions: []string{"req.url.path.startsWith('/api/')"}, Actions: []policy.Action{
		{Type: policy.ActionAddHeaders, Config: []byte(`{"headers":{"X-Order":"agent ${req.method}"}}`)}}}}}
	l, err := ag.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://good", Policy: good})
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Join(r.Header["X-Order"], ","))
	})}
	go app.Serve(l)
	t.Cleanup(func() { app.Close() })
	get := func(addr, url string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+url, nil)
		req.Host = "good.example.test"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(pub, "/api/x"); code != 200 || body != "operator,agent GET" {
		t.Errorf("through the edge: %d %q", code, body)
	}

	// An edge embedded without the engine.
	agents2, _ := start(nil)
	ag2 := &agent.Client{Addrs: []string{agents2}}
	t.Cleanup(func() { ag2.Close() })
	_, err = ag2.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://good", Policy: good})
	if err == nil || !strings.Contains(err.Error(), "no rules engine") {
		t.Errorf("an edge without the engine: %v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Error("the bind waited instead of being refused")
	}
}
