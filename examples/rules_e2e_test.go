package examples_test

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/tunnelkit/tunnelkit/internal/testchrome"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
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

	// A browser follows the rule's 301 to the app, and shows the
	// maintenance page as the page it is.
	testtools.Need(t, "chromium")
	page := testchrome.Start(t, shop+"/old/shoes?size=42", "--host-resolver-rules=MAP *.example.test 127.0.0.1")
	page.WaitLoad(t, `document.body && document.body.textContent === 'the app'`, 30*time.Second)
	var href, heading string
	json.Unmarshal([]byte(page.Eval(t, `location.href`)), &href)
	if href != shop+"/new/shoes?size=42" {
		t.Errorf("Chromium after the redirect: %s", href)
	}
	page.Navigate(t, shop+"/deploying")
	page.WaitLoad(t, `document.querySelector('h1') !== null`, 30*time.Second)
	json.Unmarshal([]byte(page.Eval(t, `document.querySelector('h1').textContent + '|' + document.body.textContent`)), &heading)
	if heading != "Back soon|Back soon /deploying" {
		t.Errorf("Chromium on the maintenance page: %q", heading)
	}

	// A reload whose rule names a variable that is not there: the agent
	// refuses the file as it reads it (as the edge would refuse the
	// bind), naming the rule and the column; the old rules hold.
	bad := strings.Replace(rules, "req.url.path == '/deploying'", "req.uri.path == '/deploying'", 1)
	writeFile(t, dir, "agent.yml", "edge: "+agents+"\nstate: \"\"\nendpoints:\n  - url: http://shop\n    to: "+app+"\n    policy:"+bad)
	a.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the agent said the endpoint stays", func() bool {
		s := a.stderr.String()
		return strings.Contains(s, "SIGHUP: the file was not read again; the endpoints stay as they were") && strings.Contains(s, `on_http_request[0] \"maintenance\": expressions[0]: column 1: undeclared reference to 'req'`)
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

// adjacentPorts returns two free loopback ports, one after the other.
func adjacentPorts(t *testing.T) (int, int) {
	t.Helper()
	for range 100 {
		_, p, _ := net.SplitHostPort(freePort(t))
		n, _ := strconv.Atoi(p)
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n+1))); err == nil {
			ln.Close()
			return n, n + 1
		}
	}
	t.Fatal("no two adjacent free ports")
	return 0, 0
}

// TestMoreRulesWithTheBinaries: the actions the first test does not run,
// through the binaries: on tcp endpoints, deny, restrict-ips and
// rate-limit on connect; on http, url-rewrite, remove-headers,
// restrict-ips, basic-auth and verify-webhook, with curl.
func TestMoreRulesWithTheBinaries(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	p1, p2 := adjacentPorts(t)
	agents, pub := freePort(t), freePort(t)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test",
		"-tcp-ports", fmt.Sprintf("%d-%d", p1, p2))
	waitListening(t, agents)
	waitListening(t, pub)

	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Powered-By", "PHP/5.1")
		if r.URL.Path == "/boom" {
			http.Error(w, "panic: a stack trace with secrets", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "%s debug=%q user=%q", r.URL.RequestURI(), r.Header.Get("X-Debug"), r.Header.Get("Tunnelkit-Auth-User"))
	})}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })
	echo := echoServer(t)

	dir := t.TempDir()
	config := writeFile(t, dir, "agent.yml", fmt.Sprintf(`edge: %s
state: ""
endpoints:
  - url: tcp://:%d
    to: %s
    policy:
      on_tcp_connect:
        - name: closed
          actions: [{type: deny}]
  - url: tcp://:%d
    to: %s
    policy:
      on_tcp_connect:
        - name: loopback only
          actions: [{type: restrict-ips, config: {allow: [127.0.0.0/8]}}]
        - name: two a minute
          expressions: ["conn.server_port == %d"]
          actions: [{type: rate-limit, config: {name: conns, capacity: 2, rate: 60s}}]
  - url: http://more
    to: %s
    policy:
      on_http_request:
        - name: v1 to v2
          actions: [{type: url-rewrite, config: {from: "/v1/", to: "/v2/"}}]
        - name: no debug
          actions: [{type: remove-headers, config: {headers: [X-Debug]}}]
        - name: office
          expressions: ["req.url.path.startsWith('/office')"]
          actions: [{type: restrict-ips, config: {allow: [10.0.0.0/8]}}]
        - name: login
          expressions: ["req.url.path.startsWith('/private')"]
          actions: [{type: basic-auth, config: {realm: Private, credentials: ["ann:correct-horse"]}}]
        - name: hooks
          expressions: ["req.url.path == '/hook'"]
          actions: [{type: verify-webhook, config: {provider: github, secret: s3cret}}]
      on_http_response:
        - name: hide errors
          expressions: ["res.status_code >= 500"]
          actions: [{type: custom-response, config: {status_code: 502, body: "something went wrong"}}]
        - name: quiet
          actions: [{type: remove-headers, config: {headers: [X-Powered-By]}}]
`, agents, p1, echo, p2, echo, p2, appLn.Addr().String()))
	if err := os.Chmod(config, 0o600); err != nil {
		t.Fatal(err)
	}
	a := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-config", config)
	var more string
	for range 3 {
		if u := a.line(t); strings.HasPrefix(u, "http://") {
			more = u
		}
	}

	talk := func(port int) string {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "hi\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "closed"
		}
		return line
	}
	if got := talk(p1); got != "closed" {
		t.Errorf("deny on connect: %q", got)
	}
	for i, want := range []string{"echo: hi\n", "echo: hi\n", "closed"} {
		if got := talk(p2); got != want {
			t.Errorf("rate-limit on connect, connection %d: %q; want %q", i, got, want)
		}
	}

	if code, _, body := curlVia(t, pub, more+"/v1/items?a=1", "-H", "X-Debug: 1"); code != "200" || body != `/v2/items?a=1 debug="" user=""` {
		t.Errorf("url-rewrite and remove-headers: %s %q", code, body)
	}
	if code, h, body := curlVia(t, pub, more+"/boom"); code != "502" || body != "something went wrong" || h.Get("X-Powered-By") != "" {
		t.Errorf("custom-response on a response: %s %q %v", code, body, h)
	}
	if _, h, _ := curlVia(t, pub, more+"/v2/x"); h.Get("X-Powered-By") != "" {
		t.Errorf("remove-headers on a response: %v", h)
	}
	if code, _, _ := curlVia(t, pub, more+"/office/plan"); code != "403" {
		t.Errorf("restrict-ips on a request: %s", code)
	}
	if code, h, _ := curlVia(t, pub, more+"/private/x"); code != "401" || h.Get("Www-Authenticate") != `Basic realm="Private", charset="UTF-8"` {
		t.Errorf("basic-auth without credentials: %s %v", code, h)
	}
	if code, _, body := curlVia(t, pub, more+"/private/x", "-u", "ann:correct-horse"); code != "200" || body != `/private/x debug="" user="ann"` {
		t.Errorf("basic-auth: %s %q", code, body)
	}
	payload := `{"zen":"Keep it logically awesome."}`
	mac := hmac.New(sha256.New, []byte("s3cret"))
	mac.Write([]byte(payload))
	sig := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if code, _, _ := curlVia(t, pub, more+"/hook", "--data-binary", payload, "-H", "X-Hub-Signature-256: "+sig); code != "200" {
		t.Errorf("verify-webhook, signed: %s", code)
	}
	if code, h, _ := curlVia(t, pub, more+"/hook", "--data-binary", payload, "-H", "X-Hub-Signature-256: sha256=00"); code != "403" || h.Get("Tunnelkit-Error") != "webhook_invalid" {
		t.Errorf("verify-webhook, badly signed: %s %v", code, h)
	}
}
