package policy

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

func TestParseRoundTrip(t *testing.T) {
	in := Spec{
		CIDRAllow:       []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
		CIDRDeny:        []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		BasicAuth:       &BasicAuth{Credentials: []string{"ann:pw:with:colons"}, PassAuthorization: true},
		RateLimit:       &RateLimit{Requests: 10, Seconds: 60},
		RequestHeaders:  &Headers{Add: []string{"X-Env: prod"}, Remove: []string{"X-Debug"}},
		ResponseHeaders: &Headers{Remove: []string{"Server"}},
		Webhook:         &Webhook{Provider: WebhookGitHub, Secret: "s"},
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse(%s): %v", b, err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip changed the spec:\n in %+v\nout %+v", in, out)
	}
	for _, s := range []string{"null", "{}", ` { } `} {
		if got, err := Parse([]byte(s)); err != nil || !got.IsZero() {
			t.Errorf("Parse(%s) = %v, %v; want the zero Spec", s, got, err)
		}
	}
}

func TestParseStrict(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
		text string // in the error
	}{
		{`{"ip_restriction":{}}`, ErrUnknownKind, `"ip_restriction"`},
		{`{"cidr_allow":["10.0.0.0/8"],"geo_block":["FR"]}`, ErrUnknownKind, `"geo_block"`},
		{`{"CIDR_ALLOW":["10.0.0.0/8"]}`, ErrUnknownKind, `"CIDR_ALLOW"`},
		{`{"basic_auth":{"credentials":["a:b"],"realm":"x"}}`, ErrInvalid, `basic_auth: unknown field "realm"`},
		{`{"oidc":{"issuer":"https://i","client_id":"c","Client_Secret":"s"}}`, ErrInvalid, `unknown field "Client_Secret"`},
		{`{"rate_limit":{"requests":1},"rate_limit":{"requests":2}}`, ErrInvalid, "rate_limit given twice"},
		{`{"webhook":{"provider":"github","secret":"a","secret":"b"}}`, ErrInvalid, "secret given twice"},
		{`{"rate_limit":{"requests":"many"}}`, ErrInvalid, "rate_limit.requests"},
		{`{"cidr_deny":["10.0.0.0/33"]}`, ErrInvalid, "10.0.0.0/33"},
		{`{"cidr_deny":"10.0.0.0/8"}`, ErrInvalid, "cidr_deny"},
		{`[]`, ErrInvalid, "JSON object"},
		{`{"rate_limit":[]}`, ErrInvalid, "rate_limit: want a JSON object"},
		{`{} {}`, ErrInvalid, ""},
		{`{"request_headers":{"add":["A: b"],"set":[]}}`, ErrInvalid, `headers: unknown field "set"`},
		{`{`, ErrInvalid, ""},
		{"{\"\xff\":1}", ErrUnknownKind, `"\ufffd"`},
	} {
		_, err := Parse([]byte(tc.in))
		if !errors.Is(err, tc.want) || !strings.Contains(fmtErr(err), tc.text) {
			t.Errorf("Parse(%s) = %v; want %v mentioning %q", tc.in, err, tc.want, tc.text)
		}
	}
	// A secret in a value of the wrong type is not quoted back.
	_, err := Parse([]byte(`{"webhook":{"provider":"github","secret":["hunter2"]}}`))
	if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("wrong-type secret: %v", err)
	}
	big := `{"cidr_deny":["` + strings.Repeat("1.2.3.4/32\",\"", MaxSpecBytes/12) + `1.2.3.4/32"]}`
	if _, err := Parse([]byte(big)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Parse of %d bytes: %v; want ErrTooLarge", len(big), err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The spec's JSON member names are the kinds' names.
func TestKindsAreJSONNames(t *testing.T) {
	var kinds []string
	for name := range specFields {
		kinds = append(kinds, name)
	}
	all := Spec{
		CIDRAllow: []netip.Prefix{{}}, CIDRDeny: []netip.Prefix{{}}, BasicAuth: &BasicAuth{}, OIDC: &OIDC{},
		MutualTLS: &MutualTLS{}, RateLimit: &RateLimit{}, RequestHeaders: &Headers{}, ResponseHeaders: &Headers{}, Webhook: &Webhook{},
		OnTCPConnect: []Rule{{}}, OnHTTPRequest: []Rule{{}}, OnHTTPResponse: []Rule{{}},
	}
	got := all.Kinds()
	if len(got) != len(kinds) {
		t.Fatalf("Kinds() = %v; JSON members %v", got, kinds)
	}
	for _, k := range got {
		if !specFields[k] {
			t.Errorf("kind %s is no JSON member", k)
		}
		if kindProtos[k] == "" {
			t.Errorf("kind %s has no protocols", k)
		}
	}
}

func TestSpecStringHidesSecrets(t *testing.T) {
	s := Spec{
		BasicAuth: &BasicAuth{Credentials: []string{"ann:hunter2"}},
		OIDC:      &OIDC{Issuer: "https://i.example", ClientID: "c", ClientSecret: "topsecret", AllowDomains: []string{"example.com"}},
		Webhook:   &Webhook{Provider: WebhookSlack, Secret: "whsecret"},
		CIDRDeny:  []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	}
	for _, out := range []string{s.String(), s.LogValue().String()} {
		for _, secret := range []string{"hunter2", "topsecret", "whsecret", "ann"} {
			if strings.Contains(out, secret) {
				t.Errorf("%q shows %q", out, secret)
			}
		}
	}
	if want := "policy{cidr_deny:1 basic_auth:1 oidc:1 webhook}"; s.String() != want {
		t.Errorf("String() = %q; want %q", s.String(), want)
	}
}

// The protocols are the wire's names for them.
func TestProtosAreWireNames(t *testing.T) {
	for mine, theirs := range map[string]string{ProtoHTTP: wire.ProtoHTTP, ProtoHTTPS: wire.ProtoHTTPS, ProtoTLS: wire.ProtoTLS, ProtoTCP: wire.ProtoTCP} {
		if mine != theirs {
			t.Errorf("policy says %q, the wire %q", mine, theirs)
		}
	}
}
