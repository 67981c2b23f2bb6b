package edgecmd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/policy"
)

// -proxy-protocol-from takes CIDR prefixes and single addresses, comma
// separated and repeated.
func TestProxyProtocolFromFlag(t *testing.T) {
	var l prefixList
	for _, v := range []string{"10.0.0.0/8, 192.0.2.7", "2001:db8::/32"} {
		if err := l.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("2001:db8::/32"),
	}
	if !slices.Equal(l, want) {
		t.Fatalf("prefixes %v, want %v", l, want)
	}
	if got := l.String(); got != "10.0.0.0/8,192.0.2.7/32,2001:db8::/32" {
		t.Errorf("String() = %q", got)
	}
}

// A bad prefix stops the command before it listens, saying which flag and
// which value.
func TestProxyProtocolFromBadPrefix(t *testing.T) {
	for _, bad := range []string{"10.0.0.0/33", "10.0.0.0/8,lb.example.com", "10.0.0.0/8,"} {
		var stderr strings.Builder
		err := Run(context.Background(), "edge", []string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0", "-proxy-protocol-from", bad}, io.Discard, &stderr, nil)
		if err == nil || !strings.Contains(err.Error(), "-proxy-protocol-from") || !strings.Contains(err.Error(), "not a CIDR prefix") {
			t.Errorf("-proxy-protocol-from %q: %v, want an error naming the flag and the bad value", bad, err)
		}
	}
}

// configured runs the command with args up to its Configure step, and
// returns the Server the flags made.
func configured(t *testing.T, args ...string) *edge.Server {
	t.Helper()
	var got *edge.Server
	stop := errors.New("stop here")
	ext := &Extension{Configure: func(_ context.Context, srv *edge.Server, _ *slog.Logger) (func(), error) {
		got = srv
		return nil, stop
	}}
	args = append([]string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0"}, args...)
	if err := Run(context.Background(), "edge", args, io.Discard, io.Discard, ext); !errors.Is(err, stop) {
		t.Fatalf("edge %v: %v", args, err)
	}
	return got
}

// The record of names goes next to the ticket key unless -state says
// where (or, empty, that there is none).
func TestStateFlag(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "ticket.key")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"-ticket-key", key}, dir},
		{[]string{"-ticket-key", key, "-state", "/var/lib/edge"}, "/var/lib/edge"},
		{[]string{"-ticket-key", key, "-state", ""}, ""},
		{[]string{"-state", "/var/lib/edge"}, "/var/lib/edge"},
	} {
		if got := configured(t, c.args...).StateDir; got != c.want {
			t.Errorf("edge %v: StateDir %q, want %q", c.args, got, c.want)
		}
	}
}

// The quota flags set the Limits of the same names.
func TestEndpointQuotaFlags(t *testing.T) {
	srv := configured(t, "-max-endpoints-per-identity", "7", "-max-endpoints-per-source", "-1", "-max-endpoints-total", "9", "-max-sessions-per-identity", "20000")
	want := edge.Limits{EndpointsPerIdentity: 7, EndpointsPerSource: -1, Endpoints: 9, SessionsPerIdentity: 20000}
	if srv.Limits != want {
		t.Fatalf("Limits %+v, want %+v", srv.Limits, want)
	}
}

// -max-reservations and -max-reservations-per-identity set the Limits
// of the operator's reservations.
func TestReservationFlags(t *testing.T) {
	srv := configured(t, "-max-reservations", "100", "-max-reservations-per-identity", "-1")
	if srv.Limits.Reservations != 100 || srv.Limits.ReservationsPerIdentity != -1 {
		t.Fatalf("Limits %+v, want Reservations 100, ReservationsPerIdentity -1", srv.Limits)
	}
}

// -body-timeout, -http-idle and -heartbeat-interval set the Timeouts of
// the same names; -drain-timeout gives agents two thirds of it to move
// (Timeouts.Move), none when it is none.
func TestTimeoutFlags(t *testing.T) {
	if srv := configured(t); srv.Timeouts != (edge.Timeouts{Move: 20 * time.Second}) {
		t.Errorf("Timeouts %+v without flags, want the defaults (zero) and Move 20s", srv.Timeouts)
	}
	srv := configured(t, "-body-timeout", "30s", "-http-idle", "-1s", "-heartbeat-interval", "45s", "-drain-timeout", "90s")
	want := edge.Timeouts{Body: 30 * time.Second, HTTPIdle: -time.Second, HeartbeatInterval: 45 * time.Second, Move: time.Minute}
	if srv.Timeouts != want {
		t.Fatalf("Timeouts %+v, want %+v", srv.Timeouts, want)
	}
	if srv := configured(t, "-drain-timeout", "0s"); srv.Timeouts.Move != 0 {
		t.Errorf("-drain-timeout 0s: Move %v, want 0 (the default)", srv.Timeouts.Move)
	}
}

// -policy FILE is the operator's policy on every endpoint; -policy-kinds
// and -oidc-issuer-allowed limit what agents declare; a file that is no
// policy stops the command, naming the flag and why.
func TestPolicyFlags(t *testing.T) {
	if srv := configured(t); srv.Policy != nil {
		t.Error("an operator policy without -policy")
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.json")
	os.WriteFile(file, []byte(`{"cidr_deny":["192.0.2.0/24"],"request_headers":{"add":["X-Operator: yes"]}}`), 0o600)
	srv := configured(t, "-policy", file, "-policy-kinds", "basic_auth, rate_limit", "-oidc-issuer-allowed", "https://id.example.com")
	if srv.Policy == nil {
		t.Fatal("no operator policy with -policy")
	}
	op := srv.Policy("anyone")
	if got := op.Policy.Kinds(); !slices.Equal(got, []string{policy.KindCIDRDeny, policy.KindRequestHeaders}) {
		t.Errorf("the operator's kinds %v", got)
	}
	if !slices.Equal(op.Kinds, []string{policy.KindBasicAuth, policy.KindRateLimit}) || !slices.Equal(op.OIDCIssuers, []string{"https://id.example.com"}) {
		t.Errorf("caps %v, %v", op.Kinds, op.OIDCIssuers)
	}
	srv = configured(t, "-policy", file, "-policy-actions", "deny, redirect", "-policy-kinds", "on_http_request,on_tcp_connect")
	if op := srv.Policy("anyone"); !slices.Equal(op.Actions, []string{policy.ActionDeny, policy.ActionRedirect}) || !slices.Equal(op.Kinds, []string{policy.PhaseHTTPRequest, policy.PhaseTCPConnect}) {
		t.Errorf("-policy-actions %v, -policy-kinds %v", op.Actions, op.Kinds)
	}
	if err := Run(context.Background(), "edge", []string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0", "-policy-actions", "compress-response"}, io.Discard, io.Discard, nil); err == nil || !strings.Contains(err.Error(), `-policy-actions: "compress-response" is not an action`) {
		t.Errorf("an unknown action: %v", err)
	}
	for name, content := range map[string]string{
		"unknown kind": `{"ip_reputation":{}}`,
		"bad header":   `{"request_headers":{"add":["Host: evil"]}}`,
		"clash":        `{"oidc":{"issuer":"https://id.example.com","client_id":"c","allow_domains":["example.com"]},"basic_auth":{"credentials":["a:b"]}}`,
		"rule":         `{"on_http_request":[{"name":"typo","expressions":["req.uri.path == '/'"],"actions":[{"type":"deny"}]}]}`,
	} {
		bad := filepath.Join(dir, "bad.json")
		os.WriteFile(bad, []byte(content), 0o600)
		err := Run(context.Background(), "edge", []string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0", "-policy", bad}, io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "-policy") || !strings.Contains(err.Error(), "policy:") {
			t.Errorf("%s: %v; want an error naming -policy and the policy's reason", name, err)
		}
	}
}

// -tls-agents=false turns agent sessions on -tls off; they are on by
// default. An edge with no -agents needs them, and a certificate.
func TestTLSAgentsFlag(t *testing.T) {
	if srv := configured(t); srv.NoAgentsOnTLS {
		t.Error("agent sessions on -tls are off by default")
	}
	if srv := configured(t, "-tls-agents=false"); !srv.NoAgentsOnTLS {
		t.Error("-tls-agents=false left agent sessions on -tls on")
	}
	for _, args := range [][]string{
		{"-agents", "", "-http", "127.0.0.1:0"},
		{"-agents", "", "-http", "127.0.0.1:0", "-tls", "127.0.0.1:0"},
	} {
		err := Run(context.Background(), "edge", args, io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "-agents is empty") {
			t.Errorf("edge %q: %v, want a refusal: agents would have nowhere to connect", args, err)
		}
	}
}

// A -config file sets what the flags set, each flag's name with _ for -
// its key; a flag given wins over its key; tokens and policy are written
// in the file itself too.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "edge.yml")
	os.WriteFile(file, []byte(`# an edge's settings
domain: example.com
max_endpoints_per_identity: 7
body_timeout: 30s
http_idle: -1s
allow_catch_all: true
proxy_protocol_from: [10.0.0.0/8, 192.0.2.7]
policy_kinds: [basic_auth, rate_limit]
oidc_issuer_allowed:
  - https://id.example.com
tokens:
  - token: ${EDGECMD_TEST_TOKEN}
    identity: team-a
  - token: other
    identity: team-b
policy:
  cidr_deny: [192.0.2.0/24]
`), 0o600)
	t.Setenv("EDGECMD_TEST_TOKEN", "s3cret")
	srv := configured(t, "-config", file, "-body-timeout", "5s")
	if srv.Domain != "example.com" || !srv.AllowCatchAll || srv.Limits.EndpointsPerIdentity != 7 {
		t.Errorf("domain %q, catch-all %v, limits %+v", srv.Domain, srv.AllowCatchAll, srv.Limits)
	}
	if want := (edge.Timeouts{Body: 5 * time.Second, HTTPIdle: -time.Second, Move: 20 * time.Second}); srv.Timeouts != want {
		t.Errorf("Timeouts %+v, want %+v: the flag wins over body_timeout", srv.Timeouts, want)
	}
	if len(srv.ProxyProtocolFrom) != 2 {
		t.Errorf("ProxyProtocolFrom %v", srv.ProxyProtocolFrom)
	}
	for token, want := range map[string]string{"s3cret": "team-a", "other": "team-b"} {
		if id, err := srv.Authenticate(context.Background(), token); err != nil || id != want {
			t.Errorf("token %q: %q, %v; want %s", token, id, err, want)
		}
	}
	if _, err := srv.Authenticate(context.Background(), "${EDGECMD_TEST_TOKEN}"); err == nil {
		t.Error("the variable's name is a token")
	}
	op := srv.Policy("anyone")
	if len(op.Policy.CIDRDeny) != 1 || !slices.Equal(op.Kinds, []string{policy.KindBasicAuth, policy.KindRateLimit}) || !slices.Equal(op.OIDCIssuers, []string{"https://id.example.com"}) {
		t.Errorf("operator policy %+v", op)
	}
}

// A file that does not read says where and why, and the edge does not
// start.
func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ src, want string }{
		{"domian: x\n", `:1: unknown key "domian": did you mean "domain"?`},
		{"tls: [a, b]\n", ":1: tls takes one value, not a list"},
		{"max_pending: lots\n", `:1: max_pending "lots": want a whole number`},
		{"domain: a\ndomain: b\n", `:2: "domain" given twice (first at line 1)`},
		{"token: ${EDGECMD_UNSET}\n", ":1: ${EDGECMD_UNSET}: the environment does not set EDGECMD_UNSET"},
		{"tokens:\n  - token: x\n", ":2: tokens[0]: want a token and an identity"},
		{"tokens:\n  - token: x\n    identity: a\n    role: admin\n", `:4: unknown key "role" in tokens[0]`},
		{"policy:\n  ip_reputation: {}\n", ":2: policy: unknown kind"},
		{"config: other.yml\n", `:1: unknown key "config"`},
		{"tcp-ports: 1-2\n", `:1: unknown key "tcp-ports": did you mean "tcp_ports"?`},
	} {
		file := filepath.Join(dir, "edge.yml")
		os.WriteFile(file, []byte(c.src), 0o600)
		// A file that reads gets no further than the setup.
		stop := &Extension{Configure: func(context.Context, *edge.Server, *slog.Logger) (func(), error) {
			return nil, errors.New("the file was read")
		}}
		err := Run(context.Background(), "edge", []string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0", "-config", file}, io.Discard, io.Discard, stop)
		if err == nil || !strings.HasPrefix(err.Error(), file+c.want) {
			t.Errorf("%q: %v\nwant an error starting %s%s", c.src, err, file, c.want)
		}
	}
}

// -admin-token-file goes with -admin, and must be its owner's alone.
func TestAdminTokenFlags(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("a-token-of-sixteen-bytes-or-more"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-admin-token-file", open}, "give -admin too"},
		{[]string{"-admin", "127.0.0.1:0", "-admin-token-file", open}, "chmod 600"},
		{[]string{"-admin", "127.0.0.1:0", "-admin-token-file", filepath.Join(dir, "missing")}, "-admin-token-file"},
	} {
		args := append([]string{"-agents", "127.0.0.1:0", "-http", "127.0.0.1:0"}, c.args...)
		if err := Run(context.Background(), "edge", args, io.Discard, io.Discard, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("edge %v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// SIGHUP reads -tokens again: a file that does not parse leaves the
// tokens (and every other setting) as they were; a withdrawn token is refused from then on, others
// still taken. SIGTERM then drains the edge, and the command returns.
func TestSIGHUPAndSIGTERM(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("alice-token alice\nbob-token bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	agents := ln.Addr().String()
	ln.Close()
	var logs testtools.Buffer
	sig := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), "edge", []string{"-agents", agents, "-http", "127.0.0.1:0", "-tokens", tokens}, io.Discard, &logs, nil, sig)
	}()
	testwait.For(t, func() bool { return strings.Contains(logs.String(), `msg="edge up"`) })
	listen := func(token string) error {
		c := &agent.Client{Addrs: []string{agents}, Token: token}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := c.Listen(ctx, "http://"+strings.TrimSuffix(token, "-token"))
		if err == nil {
			l.Close()
		}
		return err
	}
	hup := func(content, logged string) {
		t.Helper()
		if err := os.WriteFile(tokens, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		n := strings.Count(logs.String(), logged)
		sig <- syscall.SIGHUP
		testwait.For(t, func() bool { return strings.Count(logs.String(), logged) > n })
	}
	if err := listen("alice-token"); err != nil {
		t.Fatalf("alice before: %v", err)
	}
	hup("alice-token\n", "SIGHUP: the settings were not read again")
	if err := listen("alice-token"); err != nil {
		t.Errorf("alice after a SIGHUP with a broken file: %v", err)
	}
	hup("bob-token bob\n", "SIGHUP: the settings were read again")
	if err := listen("alice-token"); !errors.Is(err, agent.ErrUnauthorized) {
		t.Errorf("alice after her token was withdrawn: %v, want ErrUnauthorized", err)
	}
	if err := listen("bob-token"); err != nil {
		t.Errorf("bob: %v", err)
	}
	sig <- syscall.SIGTERM
	if err := <-done; err != nil {
		t.Errorf("after SIGTERM: %v", err)
	}
	if !strings.Contains(logs.String(), `msg=drained`) {
		t.Errorf("no drain logged:\n%s", logs.String())
	}
}
