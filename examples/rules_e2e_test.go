package examples_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// curlVia runs curl for rawURL with its host resolved to the edge at addr,
// and returns the status line's code, the headers and the body.
func curlVia(t *testing.T, addr, rawURL string, args ...string) (string, http.Header, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	cmdArgs := append([]string{"-sS", "-i", "--max-time", "10", "--resolve", u.Hostname() + ":" + port + ":127.0.0.1"}, args...)
	out, err := exec.Command("curl", append(cmdArgs, rawURL)...).Output()
	if err != nil {
		t.Fatalf("curl %s: %v", rawURL, err)
	}
	head, body, _ := strings.Cut(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n\n")
	lines := strings.Split(head, "\n")
	h := http.Header{}
	for _, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok {
			h.Add(k, strings.TrimSpace(v))
		}
	}
	code := strings.Fields(lines[0])[1]
	return code, h, body
}

// TestRulesWithTheBinaries: an edge whose operator policy has rules, and
// an agent whose config file declares ngrok-style rules, tried with curl:
// a maintenance page, /admin from one network only, a 301 from an old
// path, CORS headers on /api responses, a rate limit by API key; the
// operator's rules run around the agent's. A reload whose rules the edge
// refuses keeps the old ones in force and says which rule and why.
func TestRulesWithTheBinaries(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed (.ci/run installs it)")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	operator := writeFile(t, dir, "operator.json", `{
		"on_http_request": [{"name": "tag", "actions": [{"type": "add-headers", "config": {"headers": {"X-Operator": "in"}}}]}],
		"on_http_response": [{"name": "stamp", "expressions": ["'x-order' in res.headers"], "actions": [{"type": "add-headers", "config": {"headers": {"X-Order": "operator"}}}]}]
	}`)
	agents, pub := freePort(t), freePort(t)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test",
		"-policy", operator, "-policy-actions", "deny,custom-response,redirect,add-headers,remove-headers,rate-limit,restrict-ips")
	waitListening(t, agents)
	waitListening(t, pub)

	app := localHTTPApp(t, "the app")
	rules := `
      on_http_request:
        - name: maintenance
          expressions: ["req.url.path == '/deploying'"]
          actions:
            - type: custom-response
              config:
                status_code: 503
                headers: {Content-Type: text/html, Retry-After: "120"}
                body: "<h1>Back soon</h1> ${req.url.path}"
        - name: admin from the office
          expressions:
            - req.url.path.startsWith('/admin')
            - "!inCidrRange(conn.client_ip, '10.0.0.0/8')"
          actions:
            - type: deny
              config: {status_code: 404}
        - name: old paths
          actions:
            - type: redirect
              config: {from: "/old/(.*)", to: "/new/$1", status_code: 301}
        - name: by key
          expressions: ["'x-api-key' in req.headers"]
          actions:
            - type: rate-limit
              config: {name: per key, algorithm: sliding_window, capacity: 2, rate: 60s, bucket_key: ["req.headers['x-api-key'][0]"]}
      on_http_response:
        - name: cors
          expressions: ["req.url.path.startsWith('/api/')"]
          actions:
            - type: add-headers
              config: {headers: {Access-Control-Allow-Origin: "https://shop.example.com", X-Order: agent}}
`
	config := writeFile(t, dir, "agent.yml", "edge: "+agents+"\nstate: \"\"\nendpoints:\n  - url: http://shop\n    to: "+app+"\n    policy:"+rules)
	a := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-config", config)
	shop := a.line(t)

	if code, h, body := curlVia(t, pub, shop+"/deploying"); code != "503" || body != "<h1>Back soon</h1> /deploying" || h.Get("Retry-After") != "120" {
		t.Errorf("maintenance: %s %q %v", code, body, h)
	}
	if code, _, _ := curlVia(t, pub, shop+"/admin/users"); code != "404" {
		t.Errorf("/admin from loopback: %s", code)
	}
	if code, h, _ := curlVia(t, pub, shop+"/old/a?x=1"); code != "301" || !strings.HasSuffix(h.Get("Location"), "/new/a?x=1") {
		t.Errorf("old path: %s %v", code, h.Get("Location"))
	}
	for i, want := range []string{"200", "200", "429"} {
		if code, _, _ := curlVia(t, pub, shop+"/", "-H", "X-Api-Key: k1"); code != want {
			t.Errorf("key k1, request %d: %s; want %s", i, code, want)
		}
	}
	if code, _, _ := curlVia(t, pub, shop+"/", "-H", "X-Api-Key: k2"); code != "200" {
		t.Errorf("key k2: %s", code)
	}
	code, h, body := curlVia(t, pub, shop+"/api/items")
	if code != "200" || body != "the app" || h.Get("Access-Control-Allow-Origin") != "https://shop.example.com" || strings.Join(h.Values("X-Order"), ",") != "agent,operator" {
		t.Errorf("/api: %s %q %v", code, body, h)
	}
	if _, h, _ := curlVia(t, pub, shop+"/about"); h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("/about has CORS headers: %v", h)
	}

	// A reload whose rule names a variable that is not there: the edge
	// refuses it, naming the rule and the column; the old rules hold.
	bad := strings.Replace(rules, "req.url.path == '/deploying'", "req.uri.path == '/deploying'", 1)
	writeFile(t, dir, "agent.yml", "edge: "+agents+"\nstate: \"\"\nendpoints:\n  - url: http://shop\n    to: "+app+"\n    policy:"+bad)
	a.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the agent said the endpoint stays", func() bool {
		s := a.stderr.String()
		return strings.Contains(s, "SIGHUP: endpoint not changed; it stays as it was") && strings.Contains(s, `on_http_request[0] \"maintenance\": expressions[0]: column 1: undeclared reference to 'req'`)
	})
	if code, _, _ := curlVia(t, pub, shop+"/deploying"); code != "503" {
		t.Errorf("the old rules after a refused reload: %s", code)
	}

	// An action the operator does not let agents use is refused at bind.
	forbidden := "edge: " + agents + "\nstate: \"\"\nendpoints:\n  - url: http://hook\n    to: " + app + "\n    policy:\n      on_http_request:\n        - actions:\n            - type: verify-webhook\n              config: {provider: github, secret: s3cret}\n"
	f := writeFile(t, dir, "hook.yml", forbidden)
	out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "agent", "-config", f).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "agents may not use the action verify-webhook here") {
		t.Errorf("a forbidden action: %v\n%s", err, out)
	}
}

// TestJWTRecipeWithTheBinaries runs the JWT recipe of docs/policy.md, as
// written there but for its issuer's JWKS URL (a real JWKS server of the
// test's, on loopback over TLS: the edge runs with -oidc-allow-private and
// -oidc-ca) and the endpoint's URL and app, with curl: no token, a bad
// one, a good one whose subject the app gets.
func TestJWTRecipeWithTheBinaries(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	doc, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "<!-- jwt-recipe -->\n```yaml\n")
	recipe, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/policy.md has no JWT recipe after <!-- jwt-recipe -->")
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	jwks := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	}))
	t.Cleanup(jwks.Close)
	dir := t.TempDir()
	ca := writeFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: jwks.Certificate().Raw})))

	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "user="+r.Header.Get("X-User"))
	})}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })

	bin := build(t, "tunnelkit")
	agents, pub := freePort(t), freePort(t)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test",
		"-oidc", "-oidc-allow-private", "-oidc-ca", ca)
	waitListening(t, agents)
	waitListening(t, pub)
	r := strings.NewReplacer(
		"https://id.example.com/.well-known/jwks.json", jwks.URL+"/jwks",
		"url: https://shop", "url: http://shop",
		"to: 3000", "to: "+appLn.Addr().String())
	config := writeFile(t, dir, "agent.yml", "edge: "+agents+"\nstate: \"\"\n"+r.Replace(recipe))
	shop := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-config", config).line(t)

	sign := func(claims map[string]any) string {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: "k1"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(signer).Claims(claims).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	now := time.Now()
	good := map[string]any{"iss": "https://id.example.com/", "aud": "shop-api", "sub": "alice", "exp": now.Add(time.Hour).Unix()}
	expired := map[string]any{"iss": "https://id.example.com/", "aud": "shop-api", "sub": "alice", "exp": now.Add(-time.Hour).Unix()}

	if code, h, _ := curlVia(t, pub, shop+"/api/orders"); code != "401" || h.Get("Www-Authenticate") != "Bearer" {
		t.Errorf("no token: %s %v", code, h)
	}
	if code, h, _ := curlVia(t, pub, shop+"/api/orders", "-H", "Authorization: Bearer "+sign(expired)); code != "401" || !strings.Contains(h.Get("Www-Authenticate"), "invalid_token") {
		t.Errorf("an expired token: %s %v", code, h)
	}
	if code, _, body := curlVia(t, pub, shop+"/api/orders", "-H", "Authorization: Bearer "+sign(good)); code != "200" || body != "user=alice" {
		t.Errorf("a good token: %s %q", code, body)
	}
	if code, _, body := curlVia(t, pub, shop+"/"); code != "200" || body != "user=" {
		t.Errorf("a path outside /api/: %s %q", code, body)
	}
}
