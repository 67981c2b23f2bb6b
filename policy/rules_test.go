package policy

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func mustParse(t *testing.T, js string) Spec {
	t.Helper()
	s, err := Parse([]byte(js))
	if err != nil {
		t.Fatalf("Parse(%s): %v", js, err)
	}
	return s
}

// Parse refuses malformed rules, naming the phase, the rule and the action.
func TestParseRulesRefused(t *testing.T) {
	for _, tc := range []struct {
		js   string
		err  error
		want string
	}{
		{`{"on_http_request":[{"name":"a","actions":[{"type":"dney"}]}]}`, ErrInvalid, `on_http_request[0] "a": actions[0]: unknown action type "dney": did you mean "deny"?`},
		{`{"on_http_request":[{"actions":[{"type":"deny","config":{"status":404}}]}]}`, ErrInvalid, `on_http_request[0]: actions[0] (deny) config: unknown field "status": did you mean "status_code"?`},
		{`{"on_http_request":[{"name":"x","expresions":["true"],"actions":[]}]}`, ErrInvalid, `on_http_request[0] "x": unknown field "expresions"`},
		{`{"on_http_request":{}}`, ErrInvalid, `on_http_request: want a list of rules`},
		{`{"on_http_requests":[]}`, ErrUnknownKind, `did you mean "on_http_request"?`},
		{`{"on_http_request":[{"actions":[{"type":"deny","config":{"status_code":"x"}}]}]}`, ErrInvalid, `actions[0] (deny) config.status_code: want int`},
	} {
		_, err := Parse([]byte(tc.js))
		if !errors.Is(err, tc.err) || !strings.Contains(fmtErr(err), tc.want) {
			t.Errorf("Parse(%s) = %v; want %v containing %q", tc.js, err, tc.err, tc.want)
		}
	}
	// 10,000 rules: over the size bound of a bind, and over MaxRules as Go values.
	js := `{"on_http_request":[` + strings.Repeat(`{"actions":[{"type":"deny"}]},`, 9999) + `{"actions":[{"type":"deny"}]}]}`
	if _, err := Parse([]byte(js)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("10,000 rules: %v; want ErrTooLarge", err)
	}
	many := Spec{OnHTTPRequest: make([]Rule, 10000)}
	for i := range many.OnHTTPRequest {
		many.OnHTTPRequest[i] = Rule{Actions: []Action{{Type: ActionDeny}}}
	}
	if err := many.Validate(ProtoHTTP); !errors.Is(err, ErrTooLarge) {
		t.Errorf("10,000 rules validated: %v; want ErrTooLarge", err)
	}
}

// Validate refuses an action in a phase it does not run in, a phase that
// does not fit the protocol, and values out of bounds, naming the rule.
func TestValidateRules(t *testing.T) {
	for _, tc := range []struct {
		proto, js string
		err       error
		want      string
	}{
		{ProtoHTTP, `{"on_http_response":[{"name":"r","actions":[{"type":"redirect","config":{"to":"/x"}}]}]}`, ErrProtocol, `on_http_response[0] "r": actions[0]: redirect does not run in on_http_response`},
		{ProtoTCP, `{"on_http_request":[{"actions":[{"type":"deny"}]}]}`, ErrProtocol, `on_http_request is not for tcp endpoints`},
		{ProtoHTTP, `{"on_tcp_connect":[{"actions":[{"type":"deny"}]}]}`, ErrProtocol, `on_tcp_connect is not for http endpoints`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"redirect","config":{"from":"` + strings.Repeat("a", MaxRegexBytes+1) + `","to":"/"}}]}]}`, ErrTooLarge, `from: 1025 bytes`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"redirect","config":{"from":"(a{1000}){1000}","to":"/"}}]}]}`, ErrInvalid, `from`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"redirect","config":{"to":"/","status_code":200}}]}]}`, ErrInvalid, `status_code 200`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"add-headers","config":{"headers":{"Host":"x"}}}]}]}`, ErrInvalid, `Host may not be changed`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"rate-limit","config":{"capacity":0,"rate":"60s"}}]}]}`, ErrInvalid, `capacity 0`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"rate-limit","config":{"capacity":1,"rate":"1.5s"}}]}]}`, ErrInvalid, `whole seconds`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"custom-response","config":{"body":"${"}}]}]}`, ErrInvalid, `a ${ without its }`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[]}]}`, ErrInvalid, `no actions`},
		{ProtoHTTP, `{"on_http_request":[{"expressions":[""],"actions":[{"type":"deny"}]}]}`, ErrInvalid, `expressions[0]: empty`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"restrict-ips","config":{}}]}]}`, ErrInvalid, `neither allow nor deny`},
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"verify-webhook","config":{"provider":"gitlab","secret":"s"}}]}]}`, ErrInvalid, `provider "gitlab"`},
	} {
		s := mustParse(t, tc.js)
		err := s.Validate(tc.proto)
		if !errors.Is(err, tc.err) || !strings.Contains(fmtErr(err), tc.want) {
			t.Errorf("%s %s: %v; want %v containing %q", tc.proto, tc.js, err, tc.err, tc.want)
		}
	}
}

// Without an Engine, rules that need one are refused; those that do not
// run.
func TestRulesWithoutEngine(t *testing.T) {
	s := mustParse(t, `{"on_http_request":[{"expressions":["true"],"actions":[{"type":"deny"}]}]}`)
	if _, err := Compile(t.Context(), ProtoHTTP, s, Options{}); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "on_http_request[0]") {
		t.Errorf("Compile with an expression and no engine: %v", err)
	}
	s = mustParse(t, `{"on_http_request":[{"actions":[{"type":"add-headers","config":{"headers":{"X-P":"${req.url.path}"}}}]}]}`)
	if _, err := Compile(t.Context(), ProtoHTTP, s, Options{}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Compile with an interpolation and no engine: %v", err)
	}
}

func serve(p *Policy, method, target string, h http.Header) (*httptest.ResponseRecorder, *http.Request, bool) {
	r := httptest.NewRequest(method, target, nil)
	for k, v := range h {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	served := p.Check(w, r, netip.MustParseAddr("192.0.2.1"))
	return w, r, served
}

// Each action without expressions, on a request.
func TestRequestActions(t *testing.T) {
	compile := func(js string) *Policy {
		t.Helper()
		p, err := Compile(t.Context(), ProtoHTTP, mustParse(t, js), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// deny, with a status of its own.
	w, _, served := serve(compile(`{"on_http_request":[{"actions":[{"type":"deny","config":{"status_code":404}}]}]}`), "GET", "http://a.test/", nil)
	if !served || w.Code != 404 || w.Header().Get("Tunnelkit-Error") != CodePolicyDenied {
		t.Errorf("deny: served %v, %d %v", served, w.Code, w.Header())
	}
	// custom-response ends the phase: the deny after it never runs.
	p := compile(`{"on_http_request":[
		{"actions":[{"type":"custom-response","config":{"status_code":503,"headers":{"Retry-After":"60","Content-Type":"text/html"},"body":"<h1>back soon</h1>"}}]},
		{"actions":[{"type":"deny"}]}]}`)
	w, _, served = serve(p, "GET", "http://a.test/x", nil)
	if !served || w.Code != 503 || w.Body.String() != "<h1>back soon</h1>" || w.Header().Get("Retry-After") != "60" || w.Header().Get("Content-Type") != "text/html" {
		t.Errorf("custom-response: served %v, %d %v %q", served, w.Code, w.Header(), w.Body)
	}
	// redirect: the first match of from replaced, $1 expanded; a URL
	// that does not match goes on.
	p = compile(`{"on_http_request":[{"actions":[{"type":"redirect","config":{"from":"/old/(.*)","to":"/new/$1","status_code":301,"headers":{"X-Why":"moved"}}}]}]}`)
	w, _, served = serve(p, "GET", "http://a.test/old/page?q=1", nil)
	if !served || w.Code != 301 || w.Header().Get("Location") != "http://a.test/new/page?q=1" || w.Header().Get("X-Why") != "moved" {
		t.Errorf("redirect: served %v, %d %v", served, w.Code, w.Header())
	}
	if _, _, served = serve(p, "GET", "http://a.test/other", nil); served {
		t.Error("redirect of a URL its from does not match")
	}
	// url-rewrite: the request goes on, its path and query rewritten.
	p = compile(`{"on_http_request":[{"actions":[{"type":"url-rewrite","config":{"from":"/v1/([a-z]+)\\?accountId=[0-9]+&?","to":"/v2/$1?"}}]}]}`)
	_, r, served := serve(p, "GET", "http://a.test/v1/users?accountId=7&active=1", nil)
	if served || r.URL.Path != "/v2/users" || r.URL.RawQuery != "active=1" || r.RequestURI != "/v2/users?active=1" {
		t.Errorf("url-rewrite: served %v, %s %q", served, r.URL, r.RequestURI)
	}
	// A url-rewrite may not change the host.
	p = compile(`{"on_http_request":[{"actions":[{"type":"url-rewrite","config":{"from":"a.test","to":"evil.test"}}]}]}`)
	if w, _, served = serve(p, "GET", "http://a.test/", nil); !served || w.Code != 500 || w.Header().Get("Tunnelkit-Error") != CodePolicyError {
		t.Errorf("url-rewrite to another host: served %v, %d", served, w.Code)
	}
	// add-headers appends; remove-headers removes; reserved headers stay
	// the edge's.
	p = compile(`{"on_http_request":[{"actions":[{"type":"remove-headers","config":{"headers":["X-Debug"]}},{"type":"add-headers","config":{"headers":{"X-Env":"prod"}}}]}]}`)
	_, r, _ = serve(p, "GET", "http://a.test/", http.Header{"X-Debug": {"1"}, "X-Env": {"dev"}, "Tunnelkit-Auth-User": {"forged"}})
	if r.Header.Get("X-Debug") != "" || strings.Join(r.Header["X-Env"], ",") != "dev,prod" || r.Header.Get("Tunnelkit-Auth-User") != "" {
		t.Errorf("headers: %v", r.Header)
	}
	// restrict-ips, and enforce: false letting through.
	p = compile(`{"on_http_request":[{"actions":[{"type":"restrict-ips","config":{"allow":["10.0.0.0/8"]}}]}]}`)
	if w, _, served = serve(p, "GET", "http://a.test/", nil); !served || w.Code != 403 {
		t.Errorf("restrict-ips: served %v, %d", served, w.Code)
	}
	p = compile(`{"on_http_request":[{"actions":[{"type":"restrict-ips","config":{"allow":["10.0.0.0/8"],"enforce":false}}]}]}`)
	if _, _, served = serve(p, "GET", "http://a.test/", nil); served {
		t.Error("restrict-ips with enforce false refused")
	}
	// basic-auth with a realm; the user for later rules and the app.
	p = compile(`{"on_http_request":[{"actions":[{"type":"basic-auth","config":{"credentials":["ann:correct-horse"],"realm":"Admin"}}]}]}`)
	if w, _, served = serve(p, "GET", "http://a.test/", nil); !served || w.Code != 401 || w.Header().Get("Www-Authenticate") != `Basic realm="Admin", charset="UTF-8"` {
		t.Errorf("basic-auth without credentials: served %v, %d %v", served, w.Code, w.Header())
	}
	_, r, served = serve(p, "GET", "http://a.test/", http.Header{"Authorization": {basicHeader("ann", "correct-horse")}})
	if served || r.Header.Get(HeaderAuthUser) != "ann" || r.Header.Get("Authorization") != "" {
		t.Errorf("basic-auth with credentials: served %v, %v", served, r.Header)
	}
	// rate-limit by client address without bucket keys.
	p = compile(`{"on_http_request":[{"actions":[{"type":"rate-limit","config":{"name":"x","capacity":2,"rate":"60s"}}]}]}`)
	for i := range 3 {
		w, _, served = serve(p, "GET", "http://a.test/", nil)
		if served != (i == 2) {
			t.Errorf("rate-limit request %d: served %v (%d)", i, served, w.Code)
		}
	}
	if w.Code != 429 || w.Header().Get("Retry-After") == "" {
		t.Errorf("rate-limit: %d %v", w.Code, w.Header())
	}
}

// verify-webhook reads the body once, and the app gets it whole.
func TestVerifyWebhookAction(t *testing.T) {
	p, err := Compile(t.Context(), ProtoHTTP, mustParse(t, `{"on_http_request":[{"actions":[
		{"type":"verify-webhook","config":{"provider":"github","secret":"s3cret"}},
		{"type":"verify-webhook","config":{"provider":"github","secret":"s3cret"}}]}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.ReadsBody() {
		t.Error("ReadsBody false with verify-webhook")
	}
	body := `{"action":"opened"}`
	r := httptest.NewRequest("POST", "http://a.test/hook", strings.NewReader(body))
	r.Header.Set("X-Hub-Signature-256", "sha256="+sign("s3cret", body))
	w := httptest.NewRecorder()
	if p.Check(w, r, netip.MustParseAddr("192.0.2.1")) {
		t.Fatalf("a signed body refused: %d %s", w.Code, w.Body)
	}
	if got, _ := io.ReadAll(r.Body); string(got) != body {
		t.Errorf("the app's body: %q", got)
	}
	r = httptest.NewRequest("POST", "http://a.test/hook", strings.NewReader(body))
	r.Header.Set("X-Hub-Signature-256", "sha256="+sign("wrong", body))
	if w = httptest.NewRecorder(); !p.Check(w, r, netip.MustParseAddr("192.0.2.1")) || w.Code != 403 {
		t.Errorf("a badly signed body: %d", w.Code)
	}
}

// on_tcp_connect: deny and restrict-ips close; rules run after the kinds.
func TestConnectRules(t *testing.T) {
	p, err := Compile(t.Context(), ProtoTCP, mustParse(t, `{"cidr_deny":["192.0.2.9/32"],"on_tcp_connect":[
		{"actions":[{"type":"restrict-ips","config":{"deny":["198.51.100.0/24"]}}]}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{"192.0.2.1": true, "192.0.2.9": false, "198.51.100.7": false} {
		if _, ok := p.AcceptConn(netip.MustParseAddr(addr)); ok != want {
			t.Errorf("AcceptConn(%s) = %v", addr, ok)
		}
	}
	p, _ = Compile(t.Context(), ProtoTLS, mustParse(t, `{"on_tcp_connect":[{"actions":[{"type":"deny"}]}]}`), Options{})
	if ref, ok := p.Accept(Conn{Client: netip.MustParseAddrPort("192.0.2.1:5000")}); ok || ref.Code != CodePolicyDenied {
		t.Errorf("deny on connect: %v %v", ok, ref)
	}
}

// on_http_response: headers of the app's answer changed, or the answer
// replaced, closing the app's body.
func TestResponseRules(t *testing.T) {
	p, err := Compile(t.Context(), ProtoHTTP, mustParse(t, `{"response_headers":{"add":["X-Kind: 1"]},"on_http_response":[
		{"actions":[{"type":"remove-headers","config":{"headers":["Server"]}},{"type":"add-headers","config":{"headers":{"Access-Control-Allow-Origin":"*"}}}]}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Server": {"nginx"}}, Body: io.NopCloser(strings.NewReader("app"))}
	p.Response(resp, httptest.NewRequest("GET", "http://a.test/api", nil), netip.MustParseAddr("192.0.2.1"))
	if resp.Header.Get("Server") != "" || resp.Header.Get("Access-Control-Allow-Origin") != "*" || resp.Header.Get("X-Kind") != "1" {
		t.Errorf("response header: %v", resp.Header)
	}
	p, _ = Compile(t.Context(), ProtoHTTP, mustParse(t, `{"on_http_response":[{"actions":[{"type":"custom-response","config":{"status_code":502,"body":"oops"}}]}]}`), Options{})
	closed := &closeBody{Reader: strings.NewReader("secret stack trace")}
	resp = &http.Response{StatusCode: 500, Header: http.Header{"X-Debug": {"1"}}, Body: closed}
	p.Response(resp, httptest.NewRequest("GET", "http://a.test/", nil), netip.MustParseAddr("192.0.2.1"))
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || string(got) != "oops" || resp.Header.Get("X-Debug") != "" || !closed.closed || resp.ContentLength != 4 {
		t.Errorf("custom-response on a response: %d %v %q closed %v", resp.StatusCode, resp.Header, got, closed.closed)
	}
}

type closeBody struct {
	io.Reader
	closed bool
}

func (b *closeBody) Close() error { b.closed = true; return nil }

// The operator's rules run before the agent's on a request and after them
// on a response; the operator caps the actions agents use.
func TestCombineRules(t *testing.T) {
	op := Operator{Policy: mustParse(t, `{
		"on_http_request":[{"name":"op","actions":[{"type":"add-headers","config":{"headers":{"X-Order":"operator"}}}]}],
		"on_http_response":[{"name":"op","actions":[{"type":"add-headers","config":{"headers":{"X-Order":"operator"}}}]}]}`)}
	agent := mustParse(t, `{
		"on_http_request":[{"name":"agent","actions":[{"type":"add-headers","config":{"headers":{"X-Order":"agent"}}}]}],
		"on_http_response":[{"name":"agent","actions":[{"type":"add-headers","config":{"headers":{"X-Order":"agent"}}}]}]}`)
	c, err := Combine(ProtoHTTP, op, agent)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(t.Context(), ProtoHTTP, c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, r, _ := serve(p, "GET", "http://a.test/", nil)
	if got := strings.Join(r.Header["X-Order"], ","); got != "operator,agent" {
		t.Errorf("request order: %s", got)
	}
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
	p.Response(resp, r, netip.MustParseAddr("192.0.2.1"))
	if got := strings.Join(resp.Header["X-Order"], ","); got != "agent,operator" {
		t.Errorf("response order: %s", got)
	}
	// Combine shares no memory with its inputs.
	c.OnHTTPRequest[0].Actions[0].Config[0] = 'X'
	if op.Policy.OnHTTPRequest[0].Actions[0].Config[0] == 'X' {
		t.Error("Combine's rules share the operator's config")
	}
	op.Actions = []string{ActionAddHeaders}
	if _, err := Combine(ProtoHTTP, op, mustParse(t, `{"on_http_request":[{"actions":[{"type":"deny"}]}]}`)); !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "deny") {
		t.Errorf("an action the operator does not allow: %v", err)
	}
	op.Kinds = []string{KindBasicAuth}
	if _, err := Combine(ProtoHTTP, op, agent); !errors.Is(err, ErrForbidden) {
		t.Errorf("rules where the operator allows only basic_auth: %v", err)
	}
}

// PublicAddr: what the edge dials for a tenant (an OIDC issuer, a JWKS).
func TestPublicAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"93.184.215.14": true, "2606:2800:21f:cb07:6820:80da:af6b:8b2c": true,
		"127.0.0.1": false, "10.1.2.3": false, "192.168.0.1": false, "172.16.0.1": false,
		"100.64.0.1": false, "0.1.2.3": false, "169.254.169.254": false, "::1": false,
		"fd00::1": false, "fe80::1": false, "::ffff:127.0.0.1": false, "224.0.0.1": false, "0.0.0.0": false,
	} {
		if got := PublicAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("PublicAddr(%s) = %v", addr, got)
		}
	}
	for u, want := range map[string]bool{"https://0.1.2.3/jwks": true, "https://id.example.com/jwks": false, "https://[::1]/k": true, "https://a.localhost/k": true} {
		if got := PrivateJKU(u); got != want {
			t.Errorf("PrivateJKU(%s) = %v", u, got)
		}
	}
}
