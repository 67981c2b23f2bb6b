package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// An agent's bind carries a policy of its choosing, which the edge parses,
// and whose form it stores in the route for the other edges to compile. The
// fuzz target runs with, for example,
//
//	go test -run XXX -fuzz '^FuzzBindPolicy$' -fuzztime 2m -parallel 1 ./edge/
//
// For any bytes, on any protocol: the edge never panics; it refuses with
// bad_request, or accepts; and what it accepts, another edge compiles from
// the route to the same result (the route's form reads back as itself).
func FuzzBindPolicy(f *testing.F) {
	for _, seed := range []string{
		`{"cidr_allow":["10.0.0.0/8"],"cidr_deny":["10.9.0.0/16","::ffff:10.1.0.0/112"]}`,
		`{"basic_auth":{"credentials":["ann:s3cret"],"pass_authorization":true}}`,
		`{"rate_limit":{"requests":20,"seconds":60}}`,
		`{"request_headers":{"add":["X-Env: prod"],"remove":["X-Debug"]},"response_headers":{"remove":["Server"]}}`,
		`{"webhook":{"provider":"stripe","secret":"whsec"}}`,
		`{"oidc":{"issuer":"https://id.example.com","client_id":"c","allow_domains":["example.com"]}}`,
		`{"mutual_tls":{"cas":"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}}`,
		`null`, `{}`, `{"rate_limit":null}`, `{"Basic_Auth":{}}`, `{"cidr_deny":[]}`, ``,
	} {
		for proto := range 4 {
			f.Add(uint8(proto), []byte(seed))
		}
	}
	protos := []string{wire.ProtoHTTP, wire.ProtoHTTPS, wire.ProtoTLS, wire.ProtoTCP}
	s := &Server{Domain: "example.test"}
	s.init()
	f.Fuzz(func(t *testing.T, p uint8, raw []byte) {
		r := router.Route{Proto: protos[int(p)%len(protos)], Name: "app.example.test", Identity: "alice", TunnelID: "t1", SessionID: "s1"}
		if err := s.endpointOptions(&r, map[string]string{wire.OptPolicy: wire.PolicyVersion}, raw); err != nil {
			if len(raw) != 0 {
				t.Fatalf("options of a bind with a policy refused: %v", err)
			}
			return
		}
		pol, combined, e := s.bindPolicy(context.Background(), &r, raw)
		if e != nil {
			if e.Code != wire.CodeBadRequest || e.Message == "" {
				t.Fatalf("refused with %q %q; want bad_request and a reason", e.Code, e.Message)
			}
			return
		}
		if (pol == nil) != combined.IsZero() {
			t.Fatalf("a policy %v for the spec %v", pol, combined)
		}
		if combined.IsZero() != (r.Policy == "") {
			t.Fatalf("route's policy %q for the spec %v", r.Policy, combined)
		}
		if r.Policy == "" {
			return
		}
		// What another edge does with the route.
		back, err := policy.Parse([]byte(r.Policy))
		if err != nil {
			t.Fatalf("the route's policy %q does not read back: %v", r.Policy, err)
		}
		again, err := specJSON(back)
		if err != nil || again != r.Policy {
			t.Fatalf("the route's policy %q reads back as %q (%v)", r.Policy, again, err)
		}
		cp, err := s.routePolicy(context.Background(), r)
		if err != nil || cp.Policy() == nil {
			t.Fatalf("another edge could not compile the route's policy %q: %v", r.Policy, err)
		}
		s.forgetPolicy(r)
	})
}

// The cache of policies compiled on first use is bounded, keeps the
// policies of routes this edge holds whatever else comes, and drops a
// policy when its route goes.
func TestPolicyCache(t *testing.T) {
	t.Parallel()
	s := &Server{Domain: "example.test"}
	s.init()
	route := func(i int) router.Route {
		return router.Route{Proto: "http", Name: fmt.Sprintf("app%d.example.test", i), Identity: "alice", Edge: "other", Policy: `{"rate_limit":{"requests":5}}`}
	}
	ctx := context.Background()
	held := router.Route{Proto: "http", Name: "held.example.test", Identity: "bob", Policy: `{"rate_limit":{"requests":1}}`}
	pol, _, e := s.bindPolicy(ctx, &held, []byte(held.Policy))
	if e != nil {
		t.Fatal(e)
	}
	s.holdPolicy(held, pol)
	s.holdPolicy(held, pol) // a second route of a pool
	first, err := s.routePolicy(ctx, route(0))
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxCachedPolicies + 100 {
		if _, err := s.routePolicy(ctx, route(i)); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		return s.policies.Len()
	}
	if n := count(); n != maxCachedPolicies+1 {
		t.Errorf("%d policies kept; want %d (the bound, and the held one)", n, maxCachedPolicies+1)
	}
	if again, _ := s.routePolicy(ctx, route(0)); again == first {
		t.Error("the least recently used policy was kept past the bound")
	}
	if cp, _ := s.routePolicy(ctx, held); cp.Policy() != pol {
		t.Error("the policy of a held route was not the one compiled at its bind")
	}
	// The route of another edge goes.
	last := route(maxCachedPolicies + 99)
	s.forgetPolicy(last)
	s.forgetPolicy(held) // held here: kept
	if n := count(); n != maxCachedPolicies {
		t.Errorf("%d policies kept after one route went; want %d", n, maxCachedPolicies)
	}
	s.releasePolicy(held)
	if cp, _ := s.routePolicy(ctx, held); cp.Policy() != pol {
		t.Error("a pool's policy dropped while a route of it is held")
	}
	s.releasePolicy(held)
	if cp, _ := s.routePolicy(ctx, held); cp.Policy() == pol {
		t.Error("a policy kept after its last held route went")
	}
}

// A policy that cannot be compiled on first use is refused for a while,
// then tried again; a route without a policy on an edge without one has
// none, at no cost.
func TestPolicyOnFirstUseFails(t *testing.T) {
	t.Parallel()
	fail := true
	now := time.Now()
	s := &Server{Domain: "example.test", Clock: func() time.Time { return now }, Policy: func(string) policy.Operator {
		if fail {
			return policy.Operator{Kinds: []string{}} // no kind allowed
		}
		return policy.Operator{}
	}}
	s.init()
	r := router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", Edge: "other", Policy: `{"rate_limit":{"requests":5}}`}
	if _, err := s.routePolicy(context.Background(), r); !errors.Is(err, policy.ErrForbidden) {
		t.Fatalf("first use under an operator that forbids the kind: %v; want ErrForbidden", err)
	}
	fail = false
	if _, err := s.routePolicy(context.Background(), r); !errors.Is(err, policy.ErrForbidden) {
		t.Fatalf("at once after a failure: %v; want the failure again", err)
	}
	now = now.Add(policyRetry)
	if cp, err := s.routePolicy(context.Background(), r); err != nil || cp.Policy() == nil {
		t.Fatalf("after policyRetry: %v; want the policy", err)
	}
	none := &Server{Domain: "example.test"}
	if cp, err := none.routePolicy(context.Background(), router.Route{Proto: "http", Name: "x.example.test"}); cp != nil || err != nil {
		t.Fatalf("no policy anywhere: %v, %v", cp, err)
	}
}

// Every refusal code of package policy is a Reason whose status is the
// policy's; edges with one ticket key derive one cookie key.
func TestPolicyReasons(t *testing.T) {
	t.Parallel()
	for code, status := range map[string]int{
		policy.CodePolicyDenied: 403, policy.CodeUnauthorized: 401, policy.CodeRateLimited: 429,
		policy.CodeWebhookInvalid: 403, policy.CodeBodyTooLarge: 413, policy.CodeLoginFailed: 403,
		policy.CodeBadRequest: 400,
	} {
		found := false
		for _, r := range Reasons() {
			found = found || string(r) == code
		}
		if got := Reason(code).status(); !found || got != status {
			t.Errorf("%s: in Reasons %v, status %d; want true, %d", code, found, got, status)
		}
	}
	if got := ReasonPolicyUnavailable.status(); got != http.StatusServiceUnavailable {
		t.Errorf("policy_unavailable: %d", got)
	}
	key := bytes.Repeat([]byte{7}, 32)
	a, b := &Server{TicketKey: key}, &Server{TicketKey: bytes.Clone(key)}
	a.init()
	b.init()
	if !bytes.Equal(a.cookieKey, b.cookieKey) || len(a.cookieKey) != 32 || bytes.Equal(a.cookieKey, key) {
		t.Error("edges with one ticket key derive different cookie keys, or the ticket key itself")
	}
	c, d := &Server{}, &Server{}
	c.init()
	d.init()
	if bytes.Equal(c.cookieKey, d.cookieKey) {
		t.Error("edges without a ticket key share a cookie key")
	}
}

// loginOnly is an OIDC provider whose logins never come back.
type loginOnly struct{}

func (loginOnly) AuthCodeURL(state, nonce, verifier, redirectURL string) string {
	return "https://id.example.test/authorize?state=" + state
}

func (loginOnly) Exchange(context.Context, string, string, string) (policy.Identity, error) {
	return policy.Identity{}, errors.New("no login comes back")
}

// A request that waits for the policy another request compiles on first
// use (of an endpoint another edge bound) gets it, though net/http
// cancelled its context meanwhile, as it does when an HTTP/1.1 client
// half-closes after its request (issue #32); and a policy compiled
// already is had, whatever the context.
func TestPolicyWaitOutlivesHalfClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		compiling, release := make(chan struct{}), make(chan struct{})
		s := &Server{Domain: "example.test", OIDC: func(context.Context, policy.OIDCConfig) (policy.Provider, error) {
			close(compiling)
			<-release // a provider's discovery that takes a while
			return loginOnly{}, nil
		}}
		s.init()
		routes := []router.Route{{Proto: "https", Name: "sso.example.test", Identity: "alice", Edge: "other",
			Policy: `{"oidc":{"issuer":"https://id.example.test","client_id":"c","allow_emails":["ann@example.com"]}}`}}
		serve := func(ctx context.Context) <-chan int {
			status := make(chan int, 1)
			go func() {
				r := httptest.NewRequestWithContext(ctx, "GET", "https://sso.example.test/", nil)
				w := httptest.NewRecorder()
				if _, ok := s.checkPolicy(w, r, routes, netip.MustParseAddr("203.0.113.5")); ok {
					w.Code = 0 // let through
				}
				status <- w.Code
			}()
			return status
		}
		first := serve(context.Background())
		<-compiling
		halfClosed, cancel := context.WithCancel(context.Background())
		cancel()
		var waiters []<-chan int
		for range 8 {
			waiters = append(waiters, serve(halfClosed))
		}
		synctest.Wait()
		codes := make([]int, len(waiters))
		for i, w := range waiters {
			select {
			case codes[i] = <-w:
				t.Errorf("waiter %d, whose client half-closed, answered %d while the policy was still compiling; want it to wait", i, codes[i])
			default:
			}
		}
		close(release)
		if code := <-first; code != http.StatusFound {
			t.Fatalf("the request that compiled the policy: %d; want 302 to the login", code)
		}
		for i, w := range waiters {
			if codes[i] == 0 {
				codes[i] = <-w
			}
			if codes[i] != http.StatusFound {
				t.Errorf("waiter %d, whose client half-closed: %d; want 302 to the login, as the first got", i, codes[i])
			}
		}
		for i := range 64 {
			if cp, err := s.routePolicy(halfClosed, routes[0]); err != nil || cp.Policy() == nil {
				t.Fatalf("try %d: the policy compiled already, with a context that ended: %v; want the policy", i, err)
			}
		}
	})
}
