package rules_test

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/policy/rules"
)

// FuzzExpression compiles what a tenant may write as a condition and, when
// it compiles, runs it on a request: nothing panics, and an evaluation
// either yields a bool or fails (the policy then fails closed).
func FuzzExpression(f *testing.F) {
	for _, seed := range []string{
		"true", "req.url.path.startsWith('/admin')", "inCidrRange(conn.client_ip, '10.0.0.0/8')",
		"'x' in req.headers && req.headers['x'][0].matches('^a+$')", "req.headers.all(k, k.size() < 10)",
		"[1,2,3].map(x, x * 2).size() == 3", "time.now > timestamp('2020-01-01T00:00:00Z')",
		"req.url.query_params.exists(k, k == 'a')", "'a'.repeat(3) == 'aaa'", "size(req.cookies) >= 0",
		"actions.jwt.claims['sub'] == 'x'", "inCidrRanges(conn.client_ip, ['::/0', 'bad'])", "1/0 == 1",
	} {
		f.Add(seed)
	}
	e := rules.Engine{}
	r := httptest.NewRequest("GET", "https://app.example.test/admin/x?a=1&b=2", nil)
	r.Header.Set("X", "aaa")
	r.Header.Set("Cookie", "s=1")
	f.Fuzz(func(t *testing.T, expr string) {
		prog, err := e.Bool(policy.PhaseHTTPRequest, expr)
		if err != nil {
			return
		}
		v := &policy.Vars{Phase: policy.PhaseHTTPRequest, Request: r, Conn: policy.Conn{Client: netip.MustParseAddrPort("192.0.2.1:5000")}}
		prog(v)
	})
}
