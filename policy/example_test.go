package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/tunnelkit/tunnelkit/policy"
)

// An edge compiles the policy of a bind and checks each request with it
// before it proxies the request to the agent.
func Example() {
	// The "policy" member of an agent's bind.
	bind := []byte(`{
		"cidr_deny": ["203.0.113.0/24"],
		"basic_auth": {"credentials": ["ann:s3cret"]},
		"request_headers": {"add": ["X-Env: prod"]}
	}`)
	spec, err := policy.Parse(bind)
	if err != nil {
		fmt.Println(err)
		return
	}
	pol, err := policy.Compile(context.Background(), policy.ProtoHTTP, spec, policy.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s (%s)", r.Header.Get(policy.HeaderAuthUser), r.Header.Get("X-Env"))
	})
	edge := func(r *http.Request, client string) {
		w := httptest.NewRecorder()
		if !pol.Check(w, r, netip.MustParseAddr(client)) {
			app.ServeHTTP(w, r) // the edge proxies to the agent here
		}
		fmt.Printf("%d %s %q\n", w.Code, w.Header().Get("Tunnelkit-Error"), w.Body.String())
	}

	r := httptest.NewRequest("GET", "http://app.example.test/", nil)
	edge(r, "198.51.100.7")

	r = httptest.NewRequest("GET", "http://app.example.test/", nil)
	r.SetBasicAuth("ann", "s3cret")
	r.Header.Set(policy.HeaderAuthUser, "root") // forged: removed
	edge(r, "198.51.100.7")

	r = httptest.NewRequest("GET", "http://app.example.test/", nil)
	r.SetBasicAuth("ann", "s3cret")
	edge(r, "203.0.113.9")
	// Output:
	// 401 unauthorized "unauthorized: this endpoint needs a user and password\n"
	// 200  "hello ann (prod)"
	// 403 policy_denied "policy_denied: your address may not reach this endpoint\n"
}

// Parse refuses kinds it does not know, so that an agent never believes a
// policy holds that its edge ignores.
func ExampleParse() {
	_, err := policy.Parse([]byte(`{"geo_block":["FR"]}`))
	fmt.Println(err)
	_, err = policy.Parse([]byte(`{"rate_limit":{"requests":10,"burst":20}}`))
	fmt.Println(err)
	// Output:
	// policy: unknown kind "geo_block"
	// policy: invalid spec: rate_limit: unknown field "burst"
}

// An operator's policy combined with an agent's: deny lists add up, allow
// lists intersect, the lower rate holds.
func ExampleCombine() {
	op := policy.Operator{
		Policy: policy.Spec{
			CIDRDeny:  []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
			RateLimit: &policy.RateLimit{Requests: 100},
		},
		Kinds: []string{policy.KindCIDRAllow, policy.KindCIDRDeny, policy.KindRateLimit},
	}
	agent := policy.Spec{
		CIDRAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		CIDRDeny:  []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")},
		RateLimit: &policy.RateLimit{Requests: 600, Seconds: 60},
	}
	spec, err := policy.Combine(policy.ProtoTCP, op, agent)
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := json.Marshal(spec)
	fmt.Println(string(b))

	_, err = policy.Combine(policy.ProtoHTTP, op, policy.Spec{BasicAuth: &policy.BasicAuth{Credentials: []string{"a:b"}}})
	fmt.Println(err)
	// Output:
	// {"cidr_allow":["10.0.0.0/8"],"cidr_deny":["198.18.0.0/15","10.9.0.0/16"],"rate_limit":{"requests":600,"seconds":60}}
	// policy: not allowed by the operator: agents may not declare basic_auth here
}

// A tls or tcp endpoint's connections are decided before the agent is
// dialled. The rate limit counts per IPv6 /64.
func ExamplePolicy_AcceptConn() {
	pol, err := policy.Compile(context.Background(), policy.ProtoTCP, policy.Spec{
		CIDRAllow: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")},
		RateLimit: &policy.RateLimit{Requests: 2, Seconds: 60},
	}, policy.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, client := range []string{"2001:db8::1", "2001:db8::2", "2001:db8::3", "2001:db8:1::1", "192.0.2.1"} {
		if ref, ok := pol.AcceptConn(netip.MustParseAddr(client)); !ok {
			fmt.Println(client, "closed:", ref.Code)
			continue
		}
		fmt.Println(client, "accepted")
	}
	// Output:
	// 2001:db8::1 accepted
	// 2001:db8::2 accepted
	// 2001:db8::3 closed: rate_limited
	// 2001:db8:1::1 accepted
	// 192.0.2.1 closed: policy_denied
}
