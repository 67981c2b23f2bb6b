package rules_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/policy/rules"
)

func compile(t testing.TB, proto, js string) (*policy.Policy, error) {
	t.Helper()
	spec, err := policy.Parse([]byte(js))
	if err != nil {
		return nil, err
	}
	return policy.Compile(t.Context(), proto, spec, policy.Options{
		Engine:   rules.Engine{},
		Endpoint: policy.Endpoint{URL: "http://app.example.test", Host: "app.example.test", Protocol: proto},
	})
}

func mustCompile(t testing.TB, proto, js string) *policy.Policy {
	t.Helper()
	p, err := compile(t, proto, js)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// hop is an edge in miniature: the policy, then a ReverseProxy to an app
// that echoes what it got; a real client talks to it over loopback.
func hop(t *testing.T, p *policy.Policy) *httptest.Server {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "app/1.0")
		w.Header().Set("X-Path", r.URL.RequestURI())
		fmt.Fprintf(w, "app: %s %s user=%s env=%s", r.Method, r.URL.RequestURI(), r.Header.Get(policy.HeaderAuthUser), r.Header.Get("X-Env"))
	}))
	t.Cleanup(app.Close)
	target, _ := url.Parse(app.URL)
	var in *http.Request
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
	}
	edge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := netip.MustParseAddrPort(r.RemoteAddr).Addr()
		if p.Check(w, r, client) {
			return
		}
		in = r
		rp := *proxy
		rp.ModifyResponse = func(resp *http.Response) error {
			p.Response(resp, in, client)
			return nil
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(edge.Close)
	return edge
}

func get(t *testing.T, srv *httptest.Server, method, path string, h http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, nil)
	req.Host = "app.example.test"
	for k, v := range h {
		req.Header[k] = v
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The recipes of the documentation, through a real hop.
func TestRecipes(t *testing.T) {
	// A maintenance page for everyone but the office.
	srv := hop(t, mustCompile(t, "http", `{"on_http_request":[{
		"name":"maintenance","expressions":["!inCidrRange(conn.client_ip, '10.0.0.0/8')"],
		"actions":[{"type":"custom-response","config":{"status_code":503,"headers":{"Content-Type":"text/html","Retry-After":"120"},
		"body":"<h1>Back soon</h1><p>${req.url.path} is being deployed</p>"}}]}]}`))
	resp, body := get(t, srv, "GET", "/shop", nil)
	if resp.StatusCode != 503 || body != "<h1>Back soon</h1><p>/shop is being deployed</p>" || resp.Header.Get("Retry-After") != "120" {
		t.Errorf("maintenance: %d %q", resp.StatusCode, body)
	}

	// /admin from one network only (loopback is not it).
	srv = hop(t, mustCompile(t, "http", `{"on_http_request":[{
		"name":"admin","expressions":["req.url.path.startsWith('/admin')","!inCidrRanges(conn.client_ip, ['192.168.1.0/24', '10.8.0.0/16'])"],
		"actions":[{"type":"deny","config":{"status_code":403}}]}]}`))
	if resp, _ = get(t, srv, "GET", "/admin/users", nil); resp.StatusCode != 403 {
		t.Errorf("/admin from outside: %d", resp.StatusCode)
	}
	if resp, body = get(t, srv, "GET", "/administrator-guide", nil); resp.StatusCode != 403 {
		t.Errorf("startsWith is a prefix of the string: %d %s", resp.StatusCode, body)
	}
	if resp, body = get(t, srv, "GET", "/shop", nil); resp.StatusCode != 200 || !strings.HasPrefix(body, "app: GET /shop") {
		t.Errorf("/shop: %d %q", resp.StatusCode, body)
	}

	// A 301 from an old path, with the rest of it and the query.
	srv = hop(t, mustCompile(t, "http", `{"on_http_request":[{"actions":[{"type":"redirect",
		"config":{"from":"/old/(.*)$","to":"/new/$1","status_code":301}}]}]}`))
	resp, _ = get(t, srv, "GET", "/old/a/b?x=1", nil)
	if resp.StatusCode != 301 || resp.Header.Get("Location") != "http://app.example.test/new/a/b?x=1" {
		t.Errorf("redirect: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}

	// A rate limit by API key: each key has its own bucket.
	srv = hop(t, mustCompile(t, "http", `{"on_http_request":[{"expressions":["'x-api-key' in req.headers"],"actions":[{"type":"rate-limit",
		"config":{"name":"by key","algorithm":"sliding_window","capacity":2,"rate":"60s","bucket_key":["req.headers['x-api-key'][0]"]}}]}]}`))
	for i, tc := range []struct {
		key  string
		want int
	}{{"a", 200}, {"a", 200}, {"a", 429}, {"b", 200}, {"b", 200}, {"b", 429}} {
		if resp, _ = get(t, srv, "GET", "/", http.Header{"X-Api-Key": {tc.key}}); resp.StatusCode != tc.want {
			t.Errorf("request %d with key %s: %d; want %d", i, tc.key, resp.StatusCode, tc.want)
		}
	}

	// CORS headers on the responses of /api alone.
	srv = hop(t, mustCompile(t, "http", `{"on_http_response":[{"expressions":["req.url.path.startsWith('/api/')"],"actions":[
		{"type":"add-headers","config":{"headers":{"Access-Control-Allow-Origin":"https://app.example.com","Vary":"Origin"}}},
		{"type":"remove-headers","config":{"headers":["Server"]}}]}]}`))
	if resp, _ = get(t, srv, "GET", "/api/items", nil); resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" || resp.Header.Get("Server") != "" {
		t.Errorf("/api response: %v", resp.Header)
	}
	if resp, _ = get(t, srv, "GET", "/about", nil); resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.Header.Get("Server") != "app/1.0" {
		t.Errorf("/about response: %v", resp.Header)
	}
}

// Variables of each phase, read by rules, in order; later rules see what
// earlier ones did.
func TestVariablesAndOrder(t *testing.T) {
	srv := hop(t, mustCompile(t, "http", `{
		"on_http_request":[
			{"name":"login","expressions":["req.url.path != '/public'"],"actions":[{"type":"basic-auth","config":{"credentials":["ann:correct-horse"]}}]},
			{"name":"rewrite","expressions":["req.method == 'GET'","'v' in req.url.query_params && req.url.query_params['v'] == ['1']"],"actions":[{"type":"url-rewrite","config":{"from":"/v1/","to":"/v2/"}}]},
			{"name":"after rewrite","expressions":["req.url.path.startsWith('/v2/')"],"actions":[{"type":"add-headers","config":{"headers":{"X-Env":"${auth.user}@${endpoint.host}:${string(conn.server_port > 0)}"}}}]},
			{"name":"cookie","expressions":["'flag' in req.cookies && req.cookies['flag'][0] == 'off'"],"actions":[{"type":"deny","config":{"status_code":451}}]},
			{"name":"agent","expressions":["req.user_agent.contains('BadBot') || req.headers['user-agent'][0].matches('(?i)crawler')"],"actions":[{"type":"deny"}]}
		],
		"on_http_response":[
			{"expressions":["res.status_code == 200","res.headers['server'][0] == 'app/1.0'"],"actions":[{"type":"add-headers","config":{"headers":{"X-Seen":"${req.method} ${string(res.status_code)} ${auth.user}"}}}]}
		]}`))
	auth := http.Header{"Authorization": {"Basic " + basic("ann", "correct-horse")}}
	resp, body := get(t, srv, "GET", "/v1/items?v=1", auth)
	if resp.StatusCode != 200 || body != "app: GET /v2/items?v=1 user=ann env=ann@app.example.test:true" || resp.Header.Get("X-Seen") != "GET 200 ann" {
		t.Errorf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp, _ = get(t, srv, "GET", "/v1/items?v=1", nil); resp.StatusCode != 401 {
		t.Errorf("without a login: %d", resp.StatusCode)
	}
	if resp, body = get(t, srv, "GET", "/public", nil); resp.StatusCode != 200 || !strings.HasPrefix(body, "app: GET /public user= ") {
		t.Errorf("/public: %d %q", resp.StatusCode, body)
	}
	if resp, _ = get(t, srv, "GET", "/public", http.Header{"Cookie": {"a=1; flag=off"}}); resp.StatusCode != 451 {
		t.Errorf("cookie rule: %d", resp.StatusCode)
	}
	if resp, _ = get(t, srv, "GET", "/public", http.Header{"User-Agent": {"SomeCrawler/2"}}); resp.StatusCode != 403 {
		t.Errorf("user agent rule: %d", resp.StatusCode)
	}
	// A key that is not there is an error, and the policy fails closed:
	// rules test with "in" first.
	if resp, body = get(t, srv, "GET", "/public", http.Header{"User-Agent": nil}); resp.StatusCode != 500 || !strings.HasPrefix(body, policy.CodePolicyError) {
		t.Errorf("a rule reading a header that is not there: %d %q", resp.StatusCode, body)
	}
}

func basic(user, pass string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

// Rules the edge must refuse at bind, each error naming the rule (and the
// column, for CEL's).
func TestRefusedAtCompile(t *testing.T) {
	for _, tc := range []struct {
		proto, js, want string
	}{
		{"http", `{"on_http_request":[{"name":"typo","expressions":["req.url.path ==* '/'"],"actions":[{"type":"deny"}]}]}`, `on_http_request[0] "typo": expressions[0]: column 16: Syntax error`},
		{"http", `{"on_http_request":[{"name":"var","expressions":["req.uri.path == '/'"],"actions":[{"type":"deny"}]}]}`, `on_http_request[0] "var": expressions[0]: column 1: undeclared reference to 'req'`},
		{"http", `{"on_http_request":[{"expressions":["res.status_code == 200"],"actions":[{"type":"deny"}]}]}`, `undeclared reference to 'res'`},
		{"tcp", `{"on_tcp_connect":[{"expressions":["req.method == 'GET'"],"actions":[{"type":"deny"}]}]}`, `undeclared reference to 'req'`},
		{"http", `{"on_http_request":[{"expressions":["req.url.path"],"actions":[{"type":"deny"}]}]}`, `yields string, not a bool`},
		{"http", `{"on_http_request":[{"name":"two","expressions":["req.method == 'GET'","req.url.pth == '/'"],"actions":[{"type":"deny"}]}]}`, `on_http_request[0] "two": expressions[1]: column 8: type 'string' does not support field selection`},
		{"http", `{"on_http_request":[{"name":"nested","expressions":["req.headers.all(k, req.headers.all(j, req.headers[j].all(v, v.size() < 5)))"],"actions":[{"type":"deny"}]}]}`, `on_http_request[0] "nested": expressions[0]`},
		{"http", `{"on_http_request":[{"name":"cost","expressions":["req.headers.all(k, req.url.query_params.all(j, k + j != req.url.path))"],"actions":[{"type":"deny"}]}]}`, `estimated cost`},
		{"http", `{"on_http_request":[{"name":"re","expressions":["req.url.path.matches('` + strings.Repeat("a", 1100) + `')"],"actions":[{"type":"deny"}]}]}`, `matches() pattern of 1100 bytes`},
		{"http", `{"on_http_request":[{"name":"re2","expressions":["req.url.path.matches(req.url.query)"],"actions":[{"type":"deny"}]}]}`, `matches() takes a constant pattern`},
		{"http", `{"on_http_request":[{"actions":[{"type":"add-headers","config":{"headers":{"X":"${req.nope}"}}}]}]}`, `on_http_request[0]: actions[0] (add-headers): ${req.nope}`},
		{"http", `{"on_http_request":[{"actions":[{"type":"rate-limit","config":{"capacity":1,"rate":"60s","bucket_key":["req.headers["]}}]}]}`, `bucket_key[0]`},
		{"http", `{"on_http_request":[{"actions":[{"type":"dney"}]}]}`, `unknown action type "dney": did you mean "deny"?`},
		{"http", `{"on_http_response":[{"actions":[{"type":"rate-limit","config":{"capacity":1,"rate":"60s"}}]}]}`, `rate-limit does not run in on_http_response`},
	} {
		_, err := compile(t, tc.proto, tc.js)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n got %v\nwant %q", tc.js, err, tc.want)
		}
		if err != nil && !errors.Is(err, policy.ErrInvalid) && !errors.Is(err, policy.ErrProtocol) && !errors.Is(err, policy.ErrTooLarge) {
			t.Errorf("%s: %v is not a bad_request", tc.js, err)
		}
	}
}

// A rule over its runtime cost answers 500 policy_error, and the edge
// goes on serving.
func TestRuntimeCostLimit(t *testing.T) {
	spec, _ := policy.Parse([]byte(`{"on_http_request":[{"name":"heavy","expressions":["req.headers.exists(k, req.headers[k].exists(v, v.contains('needle')))"],"actions":[{"type":"deny"}]}]}`))
	p, err := policy.Compile(t.Context(), "http", spec, policy.Options{Engine: rules.Engine{CostLimit: 200, MaxEstimatedCost: 1 << 40}})
	if err != nil {
		t.Fatal(err)
	}
	srv := hop(t, p)
	many := http.Header{}
	for i := range 100 {
		many[fmt.Sprintf("X-H%d", i)] = []string{strings.Repeat("hay", 100)}
	}
	resp, body := get(t, srv, "GET", "/", many)
	if resp.StatusCode != 500 || resp.Header.Get("Tunnelkit-Error") != policy.CodePolicyError {
		t.Errorf("over the cost limit: %d %q", resp.StatusCode, body)
	}
	if resp, _ = get(t, srv, "GET", "/", nil); resp.StatusCode != 200 {
		t.Errorf("a cheap request after: %d", resp.StatusCode)
	}
}

func engine() rules.Engine { return rules.Engine{} }
