package rules_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/policy"
)

// typicalRules are ten rules of the kinds people write, none of which
// answers the benchmark's request: each one's expressions are evaluated
// on every request.
const typicalRules = `{"on_http_request":[
	{"name":"maintenance","expressions":["req.url.path.startsWith('/checkout')"],"actions":[{"type":"custom-response","config":{"status_code":503,"body":"back soon"}}]},
	{"name":"admin","expressions":["req.url.path.startsWith('/admin')","!inCidrRange(conn.client_ip, '10.0.0.0/8')"],"actions":[{"type":"deny"}]},
	{"name":"old","expressions":["req.url.path.startsWith('/old/')"],"actions":[{"type":"redirect","config":{"from":"/old/(.*)","to":"/new/$1","status_code":301}}]},
	{"name":"bots","expressions":["req.user_agent.matches('(?i)(bot|crawler|spider)')"],"actions":[{"type":"deny"}]},
	{"name":"methods","expressions":["!(req.method in ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'OPTIONS'])"],"actions":[{"type":"deny","config":{"status_code":405}}]},
	{"name":"api key","expressions":["req.url.path.startsWith('/api/')","!('x-api-key' in req.headers)"],"actions":[{"type":"deny","config":{"status_code":401}}]},
	{"name":"v1","expressions":["req.url.path.startsWith('/v1/')"],"actions":[{"type":"url-rewrite","config":{"from":"/v1/","to":"/v2/"}}]},
	{"name":"tag","expressions":["req.host.endsWith('.example.test')"],"actions":[{"type":"add-headers","config":{"headers":{"X-Env":"prod"}}}]},
	{"name":"strip","actions":[{"type":"remove-headers","config":{"headers":["X-Debug"]}}]},
	{"name":"per address","actions":[{"type":"rate-limit","config":{"name":"all","capacity":1000000,"rate":"1s"}}]}
]}`

// BenchmarkTenRules is a request through Check with ten typical rules,
// and, in the same run, through a policy of none (the reserved headers
// stripped): the difference is what the rules cost the edge per request.
//
//	go test -run XXX -bench TenRules -benchmem ./policy/rules/
func BenchmarkTenRules(b *testing.B) {
	for _, bc := range []struct {
		name string
		p    *policy.Policy
	}{
		{"none", nil},
		{"ten", mustCompile(b, "https", typicalRules)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := httptest.NewRequest("GET", "https://shop.example.test/products/42?color=red", nil)
			r.RemoteAddr = "192.0.2.1:50000"
			r.Header = http.Header{"Accept": {"*/*"}, "User-Agent": {"Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0"}, "Cookie": {"session=abc"}}
			client := netip.MustParseAddr("192.0.2.1")
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				delete(r.Header, "X-Env")
				if bc.p.Check(w, r, client) {
					b.Fatalf("answered: %d", w.Code)
				}
			}
		})
	}
}

// BenchmarkCompile100Rules compiles a policy of 100 rules, as a bind does.
func BenchmarkCompile100Rules(b *testing.B) {
	var rules []string
	for i := range 100 {
		rules = append(rules, fmt.Sprintf(`{"name":"r%d","expressions":["req.url.path.startsWith('/p%d/')","req.method == 'GET' || 'x-k%d' in req.headers"],"actions":[{"type":"add-headers","config":{"headers":{"X-R":"${req.url.path}-%d"}}}]}`, i, i, i, i))
	}
	js := `{"on_http_request":[` + strings.Join(rules, ",") + `]}`
	spec, err := policy.Parse([]byte(js))
	if err != nil {
		b.Fatal(err)
	}
	opts := policy.Options{Engine: engine()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.Compile(b.Context(), "https", spec, opts); err != nil {
			b.Fatal(err)
		}
	}
}
