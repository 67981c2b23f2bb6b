package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	okOIDC := &OIDC{Issuer: "https://id.example.com", ClientID: "app", AllowEmails: []string{"ann@example.com"}}
	manyPrefixes := make([]netip.Prefix, MaxCIDRs+1)
	for i := range manyPrefixes {
		manyPrefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
	}
	manyCreds := make([]string, MaxCredentials+1)
	for i := range manyCreds {
		manyCreds[i] = fmt.Sprintf("u%d:p", i)
	}
	manyEmails := make([]string, MaxOIDCAllow+1)
	for i := range manyEmails {
		manyEmails[i] = fmt.Sprintf("u%d@example.com", i)
	}
	for _, tc := range []struct {
		name  string
		proto string
		spec  Spec
		want  error // nil: valid
		text  string
	}{
		{"empty tcp", ProtoTCP, Spec{}, nil, ""},
		{"unknown proto", "udp", Spec{}, ErrProtocol, `"udp"`},
		{"cidr tcp", ProtoTCP, Spec{CIDRAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, nil, ""},
		{"rate tls", ProtoTLS, Spec{RateLimit: &RateLimit{Requests: 5}}, nil, ""},
		{"basic on tcp", ProtoTCP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"a:b"}}}, ErrProtocol, "basic_auth is not for tcp"},
		{"headers on tls", ProtoTLS, Spec{RequestHeaders: &Headers{Remove: []string{"X"}}}, ErrProtocol, "request_headers"},
		{"oidc on http", ProtoHTTP, Spec{OIDC: okOIDC}, ErrProtocol, "oidc is not for http"},
		{"mtls on tcp", ProtoTCP, Spec{MutualTLS: &MutualTLS{CAs: testCAPEM}}, ErrProtocol, "mutual_tls"},
		{"oidc https", ProtoHTTPS, Spec{OIDC: okOIDC}, nil, ""},
		{"oidc and basic", ProtoHTTPS, Spec{OIDC: okOIDC, BasicAuth: &BasicAuth{Credentials: []string{"a:b"}}}, ErrProtocol, "one login"},
		{"oidc and webhook", ProtoHTTPS, Spec{OIDC: okOIDC, Webhook: &Webhook{Provider: "github", Secret: "s"}}, ErrProtocol, "webhook"},
		{"zero prefix", ProtoTCP, Spec{CIDRDeny: []netip.Prefix{{}}}, ErrInvalid, "cidr_deny[0]"},
		{"many prefixes", ProtoTCP, Spec{CIDRDeny: manyPrefixes}, ErrTooLarge, "10001 prefixes"},
		{"no creds", ProtoHTTP, Spec{BasicAuth: &BasicAuth{}}, ErrInvalid, "no credentials"},
		{"many creds", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: manyCreds}}, ErrTooLarge, "101 credentials"},
		{"no colon", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"annpass"}}}, ErrInvalid, "credential 0"},
		{"empty password", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:"}}}, ErrInvalid, "neither empty"},
		{"empty user", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{":pw"}}}, ErrInvalid, "neither empty"},
		{"ctl", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:p\nw"}}}, ErrInvalid, "control"},
		{"dup user", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:a", "ann:b"}}}, ErrInvalid, `"ann" given twice`},
		{"long cred", ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:" + strings.Repeat("x", MaxCredentialBytes)}}}, ErrTooLarge, "credential 0"},
		{"http issuer", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "http://id.example.com", ClientID: "c", AllowDomains: []string{"example.com"}}}, ErrInvalid, "https URL"},
		{"issuer query", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "https://id.example.com/?a=b", ClientID: "c", AllowDomains: []string{"example.com"}}}, ErrInvalid, "https URL"},
		{"no client", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "https://id.example.com", AllowDomains: []string{"example.com"}}}, ErrInvalid, "client_id"},
		{"nobody allowed", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "https://id.example.com", ClientID: "c"}}, ErrInvalid, "who may log in"},
		{"many allowed", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "https://id.example.com", ClientID: "c", AllowEmails: manyEmails}}, ErrTooLarge, "501"},
		{"bad email", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "https://id.example.com", ClientID: "c", AllowEmails: []string{"ann"}}}, ErrInvalid, "e-mail"},
		{"bad domain", ProtoHTTPS, Spec{OIDC: &OIDC{Issuer: "https://id.example.com", ClientID: "c", AllowDomains: []string{"-x.com"}}}, ErrInvalid, "domain"},
		{"mtls ok", ProtoHTTPS, Spec{MutualTLS: &MutualTLS{CAs: testCAPEM}}, nil, ""},
		{"mtls key", ProtoHTTPS, Spec{MutualTLS: &MutualTLS{CAs: testCAPEM + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}}, ErrInvalid, "PRIVATE KEY"},
		{"mtls none", ProtoHTTPS, Spec{MutualTLS: &MutualTLS{CAs: "hello"}}, ErrInvalid, "not PEM"},
		{"mtls empty", ProtoHTTPS, Spec{MutualTLS: &MutualTLS{}}, ErrInvalid, "no certificate"},
		{"mtls huge", ProtoHTTPS, Spec{MutualTLS: &MutualTLS{CAs: strings.Repeat(testCAPEM, MaxPEMBytes/len(testCAPEM)+1)}}, ErrTooLarge, "bytes of PEM"},
		{"mtls many", ProtoHTTPS, Spec{MutualTLS: &MutualTLS{CAs: strings.Repeat(testCAPEM, MaxCAs+1)}}, ErrTooLarge, "certificates"},
		{"rate zero", ProtoTCP, Spec{RateLimit: &RateLimit{}}, ErrInvalid, "0 requests"},
		{"rate absurd", ProtoTCP, Spec{RateLimit: &RateLimit{Requests: MaxRateRequests + 1}}, ErrInvalid, "requests"},
		{"rate period", ProtoTCP, Spec{RateLimit: &RateLimit{Requests: 1, Seconds: MaxRateSeconds + 1}}, ErrInvalid, "seconds"},
		{"add host", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"host: evil"}}}, ErrInvalid, "Host may not"},
		{"remove te", ProtoHTTP, Spec{RequestHeaders: &Headers{Remove: []string{"TE"}}}, ErrInvalid, "Te may not"},
		{"add xff", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"X-Forwarded-For: 1.2.3.4"}}}, ErrInvalid, "X-Forwarded-For"},
		{"add identity", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"tunnelkit-auth-email: a@b.c"}}}, ErrInvalid, "Tunnelkit-Auth-Email"},
		{"resp te", ProtoHTTP, Spec{ResponseHeaders: &Headers{Add: []string{"Transfer-Encoding: chunked"}}}, ErrInvalid, "Transfer-Encoding"},
		{"resp error code", ProtoHTTP, Spec{ResponseHeaders: &Headers{Remove: []string{"Tunnelkit-Error"}}}, ErrInvalid, "Tunnelkit-Error"},
		{"resp xff ok", ProtoHTTP, Spec{ResponseHeaders: &Headers{Add: []string{"X-Forwarded-For: x"}}}, nil, ""},
		// Names that apps read as the edge's (CGI: HTTP_TUNNELKIT_AUTH_USER).
		{"add identity, underscores", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"Tunnelkit_Auth_User: root"}}}, ErrInvalid, "Tunnelkit_auth_user may not"},
		{"add identity, dots", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"Tunnelkit.Auth.User: root"}}}, ErrInvalid, "may not"},
		{"remove xff, underscores", ProtoHTTP, Spec{RequestHeaders: &Headers{Remove: []string{"X_Forwarded_For"}}}, ErrInvalid, "X_forwarded_for may not"},
		{"add forwarded port, dots", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"X.Forwarded.Port: 1"}}}, ErrInvalid, "may not"},
		{"add forwarded port ok", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"x-forwarded-port: 443"}}}, nil, ""},
		{"resp error code, underscores", ProtoHTTP, Spec{ResponseHeaders: &Headers{Add: []string{"Tunnelkit_Error: none"}}}, ErrInvalid, "may not"},
		{"resp xff, underscores ok", ProtoHTTP, Spec{ResponseHeaders: &Headers{Add: []string{"X_Forwarded_For: x"}}}, nil, ""},
		{"bad name", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"X Y: z"}}}, ErrInvalid, "not a header name"},
		{"bad value", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"X-Y: a\rb"}}}, ErrInvalid, "invalid value"},
		{"no colon add", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"X-Y"}}}, ErrInvalid, "Name: value"},
		{"many adds", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: make([]string, MaxHeaderOps+1)}}, ErrTooLarge, "65 to add"},
		{"big adds", ProtoHTTP, Spec{RequestHeaders: &Headers{Add: []string{"A: " + strings.Repeat("x", MaxHeaderBytes)}}}, ErrTooLarge, "bytes to add"},
		{"webhook unknown", ProtoHTTP, Spec{Webhook: &Webhook{Provider: "gitlab", Secret: "s"}}, ErrInvalid, `"gitlab"`},
		{"webhook no secret", ProtoHTTP, Spec{Webhook: &Webhook{Provider: "stripe"}}, ErrInvalid, "no secret"},
		{"webhook tcp", ProtoTCP, Spec{Webhook: &Webhook{Provider: "stripe", Secret: "s"}}, ErrProtocol, "webhook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate(tc.proto)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate(%s) = %v; want nil", tc.proto, err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(fmtErr(err), tc.text) {
				t.Fatalf("Validate(%s) = %v; want %v mentioning %q", tc.proto, err, tc.want, tc.text)
			}
		})
	}
}

// Errors name the entry at fault, never the password in it.
func TestValidateHidesCredentials(t *testing.T) {
	for _, c := range []string{"ann:s3cr\x01t", "s3cr3tpassword", "ann:" + strings.Repeat("s3cr3t", 100)} {
		err := (&Spec{BasicAuth: &BasicAuth{Credentials: []string{c}}}).Validate(ProtoHTTP)
		if err == nil || strings.Contains(err.Error(), "s3cr") {
			t.Errorf("Validate: %v", err)
		}
	}
}
