package rules_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/policy/rules"
)

// jwksServer is a real JWKS server on loopback, over TLS, whose keys the
// test changes, counting its fetches.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetches atomic.Int32
	down    atomic.Bool
}

func newJWKSServer(t *testing.T, keys ...jose.JSONWebKey) *jwksServer {
	s := &jwksServer{keys: keys}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		if s.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		s.mu.Lock()
		set := jose.JSONWebKeySet{Keys: s.keys}
		s.mu.Unlock()
		json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) setKeys(keys ...jose.JSONWebKey) {
	s.mu.Lock()
	s.keys = keys
	s.mu.Unlock()
}

func (s *jwksServer) roots() *x509.CertPool {
	return s.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
}

type signingKey struct {
	priv any
	kid  string
	alg  jose.SignatureAlgorithm
}

func newRSAKey(t *testing.T, kid string) signingKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return signingKey{k, kid, jose.RS256}
}

func (k signingKey) public() jose.JSONWebKey {
	var pub any
	switch p := k.priv.(type) {
	case *rsa.PrivateKey:
		pub = &p.PublicKey
	case *ecdsa.PrivateKey:
		pub = &p.PublicKey
	}
	return jose.JSONWebKey{Key: pub, KeyID: k.kid, Algorithm: string(k.alg), Use: "sig"}
}

func (k signingKey) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: k.alg, Key: jose.JSONWebKey{Key: k.priv, KeyID: k.kid}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const issuer = "https://id.example.test/"

func jwtPolicy(jku string, extra string) string {
	return `{"on_http_request":[
		{"name":"api","expressions":["req.url.path.startsWith('/api/')"],"actions":[{"type":"jwt-validation","config":{
			"issuer":{"allow_list":[{"value":"` + issuer + `"}]},
			"audience":{"allow_list":[{"value":"shop-api"}]},
			"http":{"tokens":[{"type":"jwt","method":"header","name":"Authorization","prefix":"Bearer "},{"type":"jwt","method":"cookie","name":"token"}]},
			"jws":{"allowed_algorithms":["RS256","ES256"],"keys":{"sources":{"additional_jkus":["` + jku + `"]}}}}}]},
		{"name":"who","expressions":["'sub' in actions.jwt.claims"],"actions":[{"type":"add-headers","config":{"headers":{"X-Env":"${actions.jwt.claims['sub']}"}}}]}
		` + extra + `]}`
}

func compileWith(t *testing.T, e rules.Engine, js string) (*policy.Policy, error) {
	t.Helper()
	spec, err := policy.Parse([]byte(js))
	if err != nil {
		return nil, err
	}
	return policy.Compile(t.Context(), "https", spec, policy.Options{Engine: e})
}

// A JWT-protected API, against a real JWKS server: each way a token can
// be wrong is refused; a good one gets through, its claims for later rules.
func TestJWTValidation(t *testing.T) {
	k1 := newRSAKey(t, "k1")
	js := newJWKSServer(t, k1.public())
	engine := rules.Engine{AllowPrivate: true, RootCAs: js.roots(), JWKSRefresh: 200 * time.Millisecond}
	p, err := compileWith(t, engine, jwtPolicy(js.URL+"/jwks", ""))
	if err != nil {
		t.Fatal(err)
	}
	srv := hop(t, p)
	now := time.Now()
	good := map[string]any{"iss": issuer, "aud": "shop-api", "sub": "alice", "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
	with := func(changes map[string]any) map[string]any {
		c := map[string]any{}
		for k, v := range good {
			c[k] = v
		}
		for k, v := range changes {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

	resp, body := get(t, srv, "GET", "/api/orders", bearer(k1.sign(t, good)))
	if resp.StatusCode != 200 || !strings.Contains(body, "env=alice") {
		t.Fatalf("a good token: %d %q", resp.StatusCode, body)
	}
	if resp, _ = get(t, srv, "GET", "/api/orders", http.Header{"Cookie": {"token=" + k1.sign(t, good)}}); resp.StatusCode != 200 {
		t.Errorf("a good token in the cookie: %d", resp.StatusCode)
	}
	if resp, _ = get(t, srv, "GET", "/shop", nil); resp.StatusCode != 200 {
		t.Errorf("a path the rule does not cover: %d", resp.StatusCode)
	}
	if resp, _ = get(t, srv, "GET", "/api/orders", nil); resp.StatusCode != 401 || resp.Header.Get("Www-Authenticate") != "Bearer" {
		t.Errorf("no token: %d %v", resp.StatusCode, resp.Header)
	}

	// alg none, and RS256 to HS256 confusion: the public key as an HMAC
	// secret.
	none := b64(`{"alg":"none","typ":"JWT"}`) + "." + b64(mustJSON(good)) + "."
	pubDER, _ := x509.MarshalPKIXPublicKey(&k1.priv.(*rsa.PrivateKey).PublicKey)
	hsHead := b64(`{"alg":"HS256","kid":"k1","typ":"JWT"}`) + "." + b64(mustJSON(good))
	mac := hmac.New(sha256.New, pubDER)
	mac.Write([]byte(hsHead))
	hs := hsHead + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	other := newRSAKey(t, "k1") // the same key ID, another key

	for name, tok := range map[string]string{
		"expired":           k1.sign(t, with(map[string]any{"exp": now.Add(-2 * time.Minute).Unix()})),
		"not yet valid":     k1.sign(t, with(map[string]any{"nbf": now.Add(5 * time.Minute).Unix()})),
		"issued in future":  k1.sign(t, with(map[string]any{"iat": now.Add(5 * time.Minute).Unix()})),
		"wrong issuer":      k1.sign(t, with(map[string]any{"iss": "https://evil.example.test/"})),
		"wrong audience":    k1.sign(t, with(map[string]any{"aud": "other-api"})),
		"no audience":       k1.sign(t, with(map[string]any{"aud": nil})),
		"alg none":          none,
		"HS256 confusion":   hs,
		"another key":       other.sign(t, good),
		"not a token":       "not.a.token",
		"signature cut off": strings.TrimRight(k1.sign(t, good), "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
	} {
		if resp, _ := get(t, srv, "GET", "/api/orders", bearer(tok)); resp.StatusCode != 401 || resp.Header.Get("Tunnelkit-Error") != policy.CodeUnauthorized {
			t.Errorf("%s: %d %v", name, resp.StatusCode, resp.Header)
		}
	}
	// Within the clock skew allowed: a minute.
	if resp, _ = get(t, srv, "GET", "/api/orders", bearer(k1.sign(t, with(map[string]any{"exp": now.Add(-20 * time.Second).Unix()})))); resp.StatusCode != 200 {
		t.Errorf("expired 20 s ago, within the leeway: %d", resp.StatusCode)
	}

	// Key rotation: a token of a new key ID makes one fetch, which finds
	// it; a flood of unknown key IDs costs at most one fetch per interval.
	time.Sleep(250 * time.Millisecond)
	k2 := newRSAKey(t, "k2")
	js.setKeys(k1.public(), k2.public())
	before := js.fetches.Load()
	if resp, _ = get(t, srv, "GET", "/api/orders", bearer(k2.sign(t, good))); resp.StatusCode != 200 {
		t.Errorf("a token of the key rotated in: %d", resp.StatusCode)
	}
	if got := js.fetches.Load() - before; got != 1 {
		t.Errorf("the rotation took %d fetches, want 1", got)
	}
	unknown := newRSAKey(t, "k-unknown")
	before = js.fetches.Load()
	for range 20 {
		get(t, srv, "GET", "/api/orders", bearer(unknown.sign(t, good)))
	}
	if got := js.fetches.Load() - before; got > 1 {
		t.Errorf("20 tokens of an unknown key ID made %d fetches within the interval, want at most 1", got)
	}

	// The JWKS server down, before any key was fetched: fail closed,
	// 503, not 200 and not a token error.
	js2 := newJWKSServer(t, k1.public())
	js2.down.Store(true)
	p2, err := compileWith(t, rules.Engine{AllowPrivate: true, RootCAs: js2.roots()}, jwtPolicy(js2.URL+"/jwks", ""))
	if err != nil {
		t.Fatal(err)
	}
	if resp, body = get(t, hop(t, p2), "GET", "/api/orders", bearer(k1.sign(t, good))); resp.StatusCode != 503 || resp.Header.Get("Tunnelkit-Error") != policy.CodePolicyUnavailable {
		t.Errorf("the JWKS server down: %d %q", resp.StatusCode, body)
	}
}

// An ES256 key verifies too; the key set's keys of another algorithm
// are not tried.
func TestJWTES256(t *testing.T) {
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k := signingKey{ek, "e1", jose.ES256}
	js := newJWKSServer(t, k.public())
	p, err := compileWith(t, rules.Engine{AllowPrivate: true, RootCAs: js.roots()}, jwtPolicy(js.URL, ""))
	if err != nil {
		t.Fatal(err)
	}
	tok := k.sign(t, map[string]any{"iss": issuer, "aud": []string{"x", "shop-api"}, "sub": "bob", "exp": time.Now().Add(time.Minute).Unix()})
	if resp, body := get(t, hop(t, p), "GET", "/api/x", http.Header{"Authorization": {"bearer " + tok}}); resp.StatusCode != 200 || !strings.Contains(body, "env=bob") {
		t.Errorf("ES256: %d %q", resp.StatusCode, body)
	}
}

// What the edge refuses at bind: none or HMAC algorithms, a JWKS URL that
// is not https, one at a private address for a tenant (the engine's
// default), and one outside the operator's issuers.
func TestJWTRefusedAtBind(t *testing.T) {
	cfg := func(algs, jku string) string {
		return `{"on_http_request":[{"actions":[{"type":"jwt-validation","config":{"issuer":{"allow_list":[{"value":"` + issuer + `"}]},"audience":{"allow_list":[{"value":"a"}]},
			"jws":{"allowed_algorithms":[` + algs + `],"keys":{"sources":{"additional_jkus":["` + jku + `"]}}}}}]}]}`
	}
	for _, tc := range []struct{ js, want string }{
		{cfg(`"none"`, "https://id.example.test/jwks"), `"none": unsigned tokens are never accepted`},
		{cfg(`"HS256"`, "https://id.example.test/jwks"), `"HS256": HMAC would take a public key for a shared secret`},
		{cfg(`"RS256"`, "http://id.example.test/jwks"), `want an https URL`},
		{cfg(`"RS256"`, "https://127.0.0.1:8443/jwks"), `JWKS at a non-public address`},
		{cfg(`"RS256"`, "https://10.1.2.3/jwks"), `JWKS at a non-public address`},
		{cfg(`"RS256"`, "https://localhost/jwks"), `JWKS at a non-public address`},
		{strings.Replace(cfg(`"RS256"`, "https://id.example.test/jwks"), `"jws"`, `"jwks"`, 1), `unknown field`},
		{strings.Replace(cfg(`"RS256"`, "https://id.example.test/jwks"), `{"value":"a"}`, `{"valeu":"a"}`, 1), `unknown field "valeu"`},
	} {
		_, err := compileWith(t, rules.Engine{}, tc.js)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n got %v\nwant %q", tc.js, err, tc.want)
		}
	}
	spec, _ := policy.Parse([]byte(cfg(`"RS256"`, "https://evil.example.test/jwks")))
	if _, err := policy.Combine("https", policy.Operator{OIDCIssuers: []string{"https://id.example.test/"}}, spec); !errors.Is(err, policy.ErrForbidden) {
		t.Errorf("a JWKS URL outside the operator's issuers: %v", err)
	}
	spec, _ = policy.Parse([]byte(cfg(`"RS256"`, "https://id.example.test/jwks")))
	if _, err := policy.Combine("https", policy.Operator{OIDCIssuers: []string{"https://id.example.test/"}}, spec); err != nil {
		t.Errorf("a JWKS URL at an issuer the operator allows: %v", err)
	}
	// Without an engine that validates tokens, the bind is refused.
	if _, err := policy.Compile(t.Context(), "https", spec, policy.Options{}); !errors.Is(err, policy.ErrUnsupported) {
		t.Errorf("jwt-validation without an engine: %v", err)
	}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return string(b)
}
