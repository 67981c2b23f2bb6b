package agentcmd

import (
	"errors"
	"flag"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/policy"
)

func parsePolicyFlags(args ...string) (*policy.Spec, error) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var pf policyFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return pf.spec(readTestFile)
}

func readTestFile(name string) ([]byte, error) {
	if name == "cas.pem" {
		return []byte("-----BEGIN CERTIFICATE-----\n...\n"), nil
	}
	return nil, fs.ErrNotExist
}

func TestPolicyFlags(t *testing.T) {
	got, err := parsePolicyFlags(
		"-cidr-allow", "10.0.0.0/8", "-cidr-allow", "2001:db8::1", "-cidr-deny", "10.9.0.0/16",
		"-basic-auth", "ann:s3cret", "-basic-auth", "bob:pw:with:colons", "-basic-auth-pass",
		"-oidc-issuer", "https://id.example.com", "-oidc-client-id", "app", "-oidc-client-secret", "sec",
		"-oidc-allow-email", "ann@example.com", "-oidc-allow-domain", "example.com", "-oidc-allow-domain", "example.org",
		"-mutual-tls-cas", "cas.pem",
		"-rate-limit", "100/m",
		"-request-header-add", "X-Env: prod", "-request-header-remove", "X-Debug",
		"-response-header-add", "Strict-Transport-Security: max-age=60", "-response-header-remove", "Server", "-response-header-remove", "X-Powered-By",
		"-verify-webhook", "github", "-verify-webhook-secret", "whs",
	)
	if err != nil {
		t.Fatal(err)
	}
	want := &policy.Spec{
		CIDRAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::1/128")},
		CIDRDeny:  []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")},
		BasicAuth: &policy.BasicAuth{Credentials: []string{"ann:s3cret", "bob:pw:with:colons"}, PassAuthorization: true},
		OIDC: &policy.OIDC{Issuer: "https://id.example.com", ClientID: "app", ClientSecret: "sec",
			AllowEmails: []string{"ann@example.com"}, AllowDomains: []string{"example.com", "example.org"}},
		MutualTLS:       &policy.MutualTLS{CAs: "-----BEGIN CERTIFICATE-----\n...\n"},
		RateLimit:       &policy.RateLimit{Requests: 100, Seconds: 60},
		RequestHeaders:  &policy.Headers{Add: []string{"X-Env: prod"}, Remove: []string{"X-Debug"}},
		ResponseHeaders: &policy.Headers{Add: []string{"Strict-Transport-Security: max-age=60"}, Remove: []string{"Server", "X-Powered-By"}},
		Webhook:         &policy.Webhook{Provider: "github", Secret: "whs"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %#v\nwant %#v", got, want)
	}
	if got, err := parsePolicyFlags(); got != nil || err != nil {
		t.Errorf("no flags: %v, %v; want no policy", got, err)
	}
	if got, _ := parsePolicyFlags("-rate-limit", "5/s"); *got.RateLimit != (policy.RateLimit{Requests: 5, Seconds: 1}) {
		t.Errorf("-rate-limit 5/s: %+v", *got.RateLimit)
	}
}

func TestPolicyFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		text string
	}{
		{[]string{"-cidr-deny", "10.0.0.0/33"}, "-cidr-deny"},
		{[]string{"-cidr-allow", "example.com"}, "-cidr-allow"},
		{[]string{"-rate-limit", "10"}, "-rate-limit"},
		{[]string{"-rate-limit", "0/s"}, "-rate-limit"},
		{[]string{"-rate-limit", "10/d"}, "-rate-limit"},
		{[]string{"-basic-auth-pass"}, "only with -basic-auth"},
		{[]string{"-oidc-client-id", "x"}, "only with -oidc-issuer"},
		{[]string{"-oidc-allow-email", "a@b.c"}, "only with -oidc-issuer"},
		{[]string{"-verify-webhook", "github"}, "needs -verify-webhook-secret"},
		{[]string{"-verify-webhook-secret", "s"}, "only with -verify-webhook"},
		{[]string{"-mutual-tls-cas", "missing.pem"}, "-mutual-tls-cas"},
	} {
		if _, err := parsePolicyFlags(tc.args...); err == nil || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%q: %v; want an error about %s", tc.args, err, tc.text)
		}
	}
}

// run refuses a policy that does not fit the URL before it dials an edge.
func TestRunRefusesPolicyForURL(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want error
	}{
		{[]string{"-url", "tcp://", "-basic-auth", "a:b"}, policy.ErrProtocol},
		{[]string{"-url", "http://app", "-oidc-issuer", "https://id.example.com", "-oidc-client-id", "c", "-oidc-allow-domain", "example.com"}, policy.ErrProtocol},
		{[]string{"-url", "https://app", "-request-header-add", "Host: other"}, policy.ErrInvalid},
		{[]string{"-url", "https://app", "-verify-webhook", "gitlab", "-verify-webhook-secret", "s"}, policy.ErrInvalid},
	} {
		args := append([]string{"-edge", "127.0.0.1:1", "-to", "127.0.0.1:2"}, tc.args...)
		err := run(t.Context(), args, io.Discard, io.Discard, nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("%q: %v; want %v", tc.args, err, tc.want)
		}
	}
}

// -traffic-policy-file reads a policy file as ngrok's --traffic-policy-file
// takes it (YAML or JSON), beside the flags' kinds; a kind in both, a
// malformed rule, or a file open to others that holds a secret are
// refused, naming the file's line.
func TestTrafficPolicyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	yml := write("policy.yml", `on_http_request:
  - name: old
    actions:
      - type: redirect
        config: {from: "/old/(.*)", to: "/new/$1", status_code: 301}
  - expressions: ["req.url.path == '/echo'"]
    actions:
      - type: custom-response
        config: {status_code: 200, body: "${req.url.path}"}
`, 0o644)
	got, err := parsePolicyFlags("-traffic-policy-file", yml, "-rate-limit", "5/s")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.OnHTTPRequest) != 2 || got.OnHTTPRequest[0].Name != "old" || got.RateLimit == nil || !strings.Contains(string(got.OnHTTPRequest[1].Actions[0].Config), "${req.url.path}") {
		t.Errorf("file and flags: %+v", got)
	}
	js := write("policy.json", `{"on_http_response":[{"actions":[{"type":"add-headers","config":{"headers":{"X-A":"1"}}}]}],"rate_limit":{"requests":1}}`, 0o600)
	if _, err := parsePolicyFlags("-traffic-policy-file", js, "-rate-limit", "5/s"); err == nil || !strings.Contains(err.Error(), "rate_limit is given by a flag too") {
		t.Errorf("a kind in both: %v", err)
	}
	bad := write("bad.yml", "on_http_request:\n  - actions:\n      - type: dney\n", 0o600)
	if _, err := parsePolicyFlags("-traffic-policy-file", bad); err == nil || !strings.Contains(err.Error(), `bad.yml:1`) || !strings.Contains(err.Error(), `did you mean "deny"`) {
		t.Errorf("a misspelt action: %v", err)
	}
	secret := write("secret.yml", "on_http_request:\n  - actions:\n      - type: basic-auth\n        config: {credentials: [\"ann:correct-horse\"]}\n", 0o644)
	if _, err := parsePolicyFlags("-traffic-policy-file", secret); err == nil || !strings.Contains(err.Error(), "basic-auth password") {
		t.Errorf("a password in a file others read: %v", err)
	}
}

// A rule's CEL error is found when the agent reads its settings, with the
// file's line; what needs the edge (a jwt-validation's keys) is left to it.
func TestRulesCheckedAtLoad(t *testing.T) {
	bad := &policy.Spec{OnHTTPRequest: []policy.Rule{{Name: "typo", Expressions: []string{"req.uri.path == '/'"}, Actions: []policy.Action{{Type: policy.ActionDeny}}}}}
	if err := checkRules("http", bad); err == nil || !strings.Contains(err.Error(), `on_http_request[0] "typo": expressions[0]: column 1: undeclared reference to 'req'`) {
		t.Errorf("a rule naming a variable that is not: %v", err)
	}
	jwt, err := policy.Parse([]byte(`{"on_http_request":[{"actions":[{"type":"jwt-validation","config":{"issuer":{"allow_list":[{"value":"https://i/"}]},"audience":{"allow_list":[{"value":"a"}]},"jws":{"allowed_algorithms":["RS256"],"keys":{"sources":{"additional_jkus":["https://127.0.0.1/jwks"]}}}}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkRules("http", &jwt); err != nil {
		t.Errorf("a jwt-validation whose keys only the edge may fetch: %v", err)
	}
}
