package policy

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// The fuzz targets of this package cover the parsers of what agents and
// clients send: a spec's JSON (from a bind), a request's Authorization
// header, and the names of a request's headers and trailers. Their seeds run in every plain go test; the fuzzer runs with,
// for example,
//
//	go test -run XXX -fuzz '^FuzzParse$' -fuzztime 2m -parallel 1 ./policy/

// FuzzParse checks that any JSON either fails to parse with one of the
// package's errors or parses into a spec that survives a round trip, and
// that Validate, Combine and Compile agree on it for every protocol.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{}`, `null`, `[]`, `{"cidr_allow":["10.0.0.0/8","::/0"],"cidr_deny":["10.1.0.0/16"]}`,
		`{"basic_auth":{"credentials":["ann:pw","bob:x:y"],"pass_authorization":true}}`,
		`{"oidc":{"issuer":"https://id.example.com","client_id":"c","client_secret":"s","allow_emails":["a@b.co"],"allow_domains":["example.com"]}}`,
		`{"mutual_tls":{"cas":` + jsonString(testCAPEM) + `}}`,
		`{"rate_limit":{"requests":10,"seconds":60}}`,
		`{"request_headers":{"add":["X-A: 1"],"remove":["X-B"]},"response_headers":{"add":["Server: x"],"remove":["X-Powered-By"]}}`,
		`{"webhook":{"provider":"stripe","secret":"whsec_x"}}`,
		`{"unknown":1}`, `{"basic_auth":{"credentials":["a:b"],"x":1}}`, `{"rate_limit":{"requests":1},"rate_limit":{}}`,
		`{"cidr_deny":["1.2.3.4/33"]}`, `{"request_headers":{"add":["Host: x"]}}`, `{"rate_limit":{"requests":1e3}}`,
		`{"cidr_allow":[]}`, `{"basic_auth":null}`, `{"Basic_Auth":{}}`,
		`{"on_http_request":[{"name":"admin","expressions":["req.url.path.startsWith('/admin')"],"actions":[{"type":"deny","config":{"status_code":404}}]}]}`,
		`{"on_http_request":[{"actions":[{"type":"redirect","config":{"from":"/old/(.*)","to":"/new/$1","status_code":301}}]}]}`,
		`{"on_http_request":[{"actions":[{"type":"custom-response","config":{"status_code":503,"headers":{"Retry-After":"60"},"body":"down ${req.url.path}"}}]}]}`,
		`{"on_http_response":[{"actions":[{"type":"add-headers","config":{"headers":{"Access-Control-Allow-Origin":"*"}}}]}]}`,
		`{"on_tcp_connect":[{"actions":[{"type":"restrict-ips","config":{"allow":["10.0.0.0/8"]}}]}]}`,
		`{"on_http_request":[{"actions":[{"type":"rate-limit","config":{"name":"k","algorithm":"sliding_window","capacity":10,"rate":"60s","bucket_key":["req.headers['x-api-key']"]}}]}]}`,
		`{"on_http_request":[{"actions":[{"type":"dney"}]}]}`, `{"on_http_request":[{"actions":[{"type":"deny","config":{"x":1}}]}]}`,
		`{"on_http_request":[{"actions":[{"type":"url-rewrite","config":{"from":"(","to":"/"}}]}]}`, `{"on_http_request":{}}`,
		`{"on_http_request":[{"actions":[{"type":"jwt-validation","config":{"issuer":{"allow_list":[{"value":"https://i/"}]},"audience":{"allow_list":[{"value":"a"}]},"http":{"tokens":[{"type":"jwt","method":"cookie","name":"t"}]},"jws":{"allowed_algorithms":["RS256"],"keys":{"sources":{"additional_jkus":["https://i/jwks"]}}}}}]}]}`,
		`{"on_http_request":[{"actions":[{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"c","allow_domains":["example.com"]}}]}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnknownKind) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Parse: an error of no known kind: %v", err)
			}
			return
		}
		b1, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		var s2 Spec
		if err := json.Unmarshal(b1, &s2); err != nil {
			t.Fatalf("the JSON of a parsed spec does not parse: %v\n%s", err, b1)
		}
		if b2, _ := json.Marshal(s2); string(b1) != string(b2) {
			t.Fatalf("round trip changed the spec:\n%s\n%s", b1, b2)
		}
		for _, proto := range []string{ProtoHTTP, ProtoHTTPS, ProtoTLS, ProtoTCP} {
			verr := s.Validate(proto)
			_, cerr := Combine(proto, Operator{}, s)
			if (verr == nil) != (cerr == nil) {
				t.Fatalf("%s: Validate %v, Combine with no operator %v", proto, verr, cerr)
			}
			p, err := Compile(t.Context(), proto, s, Options{})
			switch {
			case verr != nil && err == nil:
				t.Fatalf("%s: Compile accepted what Validate refused: %v", proto, verr)
			case verr == nil && err != nil && !((s.OIDC != nil || len(s.OnTCPConnect)+len(s.OnHTTPRequest)+len(s.OnHTTPResponse) > 0) && errors.Is(err, ErrUnsupported)):
				t.Fatalf("%s: Compile refused what Validate accepted: %v", proto, err)
			case err == nil:
				p.AllowAddr(mustAddr("10.1.2.3"))
				p.AcceptConn(mustAddr("2001:db8::1"))
			}
		}
	})
}

// FuzzInterpolations checks that splitting "${...}" loses no byte: the
// parts, put back together, are the input.
func FuzzInterpolations(f *testing.F) {
	for _, seed := range []string{"", "plain", "${a}", "a${b}c", "${ {'k': 1}['k'] }", `${"}"}`, "${", "$${x}", "${a}${b}", "${'\\''}"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parts, err := splitInterpolations(s)
		if err != nil {
			return
		}
		var b strings.Builder
		for _, p := range parts {
			if p.expr {
				if strings.TrimSpace(p.text) == "" {
					t.Fatalf("%q: an empty expression", s)
				}
				b.WriteString("${" + p.text + "}")
			} else {
				b.WriteString(p.text)
			}
		}
		if b.String() != s {
			t.Fatalf("%q split and joined is %q", s, b.String())
		}
	})
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// FuzzBasicAuth checks that a request gets in exactly when its
// Authorization header carries the declared pair, as net/http reads it.
func FuzzBasicAuth(f *testing.F) {
	for _, seed := range []string{
		basicHeader("ann", "s3cret"), basicHeader("ann", "s3cret!"), "Basic", "Basic ", "basic YW5uOnMzY3JldA==",
		"Basic  YW5uOnMzY3JldA==", "Basic YW5uOnMzY3JldA", "Basic YW5u\nOnMzY3JldA==", "Bearer x", "",
		"Basic " + strings.Repeat("A", 400),
	} {
		f.Add(seed)
	}
	p, err := Compile(f.Context(), ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:s3cret"}}}, Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, auth string) {
		r := newRequest("GET", "/")
		r.Header["Authorization"] = []string{auth}
		// What net/http reads, after the spaces this package also
		// allows between the scheme and the credentials.
		oracle := newRequest("GET", "/")
		norm := auth
		if len(auth) >= 6 && strings.EqualFold(auth[:6], "Basic ") {
			norm = "Basic " + strings.TrimLeft(auth[6:], " ")
		}
		oracle.Header["Authorization"] = []string{norm}
		user, pass, ok := oracle.BasicAuth()
		want := ok && user == "ann" && pass == "s3cret"
		w := discard{}
		served := p.Check(w, r, mustAddr("192.0.2.1"))
		if served == want {
			t.Fatalf("Authorization %q: let in %v; net/http reads %q:%q (%v)", auth, !served, user, pass, ok)
		}
		if !served && r.Header.Get(HeaderAuthUser) != "ann" {
			t.Fatalf("user header %q", r.Header.Get(HeaderAuthUser))
		}
	})
}

// FuzzHeaderName checks the rule by which Check drops a request header or
// trailer named like one the edge reserves or sets, as app stacks read
// names (CGI and PHP fold '_' and '.' into '-', and case): a header whose
// name reads as Tunnelkit-* is dropped, as is one that reads as
// X-Forwarded-* or Forwarded unless it is spelled canonically (the edge
// appends to those); a trailer that reads as any of them is dropped; every
// other name keeps its values; and every spelling of a name is read alike.
func FuzzHeaderName(f *testing.F) {
	for _, seed := range []string{
		"Tunnelkit-Auth-User", "Tunnelkit_Auth_User", "Tunnelkit.Auth.User", "tunnelkit-auth-user", "TUNNELKIT_AUTH_EMAIL",
		"Tunnelkit-", "Tunnelkit", "Tunnelkit_", "X-Tunnelkit-Auth-User", "Tunnelkit-Error", "Tunnelkit\u212aAuth",
		"X-Forwarded-For", "X_Forwarded_For", "x-forwarded-for", "X.Forwarded.Proto", "X-Forwarded_Host", "X-Forwarded-Port",
		"X_Forwarded_Port", "X-Forwarded", "Forwarded", "forwarded", "FORWARDED", "Forwarded_", "Forwarded-For",
		"X-Real-Ip", "X_Real_IP", "Authorization", "", "-", "_", "X Forwarded For", "x-forwarded-for\n",
	} {
		f.Add(seed)
	}
	fold := strings.NewReplacer("_", "-", ".", "-")
	lower := func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r - 'A' + 'a'
		}
		return r
	}
	f.Fuzz(func(t *testing.T, name string) {
		read := strings.Map(lower, fold.Replace(name)) // as an app reads it
		own := strings.HasPrefix(read, "tunnelkit-")
		forwarding := strings.HasPrefix(read, "x-forwarded-") || read == "forwarded"
		canonical := httpguts.ValidHeaderFieldName(name) && !strings.ContainsAny(name, "_.") && http.CanonicalHeaderKey(name) == name
		if k := kindOfName(name); (k == nameOwn) != own || (k == nameForwarding) != forwarding {
			t.Fatalf("%q, read as %q: kind %d; want Tunnelkit-* %v, forwarding %v", name, read, k, own, forwarding)
		}
		if len(name) >= len("tunnelkit-") && strings.EqualFold(name[:len("tunnelkit-")], "tunnelkit-") && !own {
			t.Fatalf("%q: kept, which the rule before issue #32 dropped", name)
		}
		// Every spelling alike: '-' for '_' and '.' and back, the case
		// swapped.
		alike := strings.Map(func(r rune) rune {
			switch {
			case r == '_' || r == '.':
				return '-'
			case r == '-':
				return '_'
			case 'a' <= r && r <= 'z':
				return r - 'a' + 'A'
			case 'A' <= r && r <= 'Z':
				return r - 'A' + 'a'
			}
			return r
		}, name)
		if kindOfName(alike) != kindOfName(name) {
			t.Fatalf("%q is of kind %d, %q of kind %d", name, kindOfName(name), alike, kindOfName(alike))
		}

		r := newRequest("POST", "/")
		r.Header[name] = []string{"v"}
		r.Trailer = http.Header{name: nil}
		r.Body = &trailingBody{Reader: strings.NewReader("x"), trailer: r.Trailer, fill: http.Header{name: {"t"}}}
		var none *Policy
		if none.Check(discard{}, r, mustAddr("192.0.2.1")) {
			t.Fatal("a nil policy answered")
		}
		kept := !own && !(forwarding && !canonical)
		if got := r.Header[name]; kept != (len(got) == 1 && got[0] == "v") || len(r.Header) > 1 {
			t.Fatalf("header %q: the app gets %v; want it kept %v", name, r.Header, kept)
		}
		kept = !own && !forwarding
		if _, ok := r.Trailer[name]; ok != kept {
			t.Fatalf("trailer %q announced %v; want %v", name, ok, kept)
		}
		io.Copy(io.Discard, r.Body)
		if got := r.Trailer[name]; kept != (len(got) == 1 && got[0] == "t") || len(r.Trailer) > 1 {
			t.Fatalf("trailer %q: the app gets %v; want it kept %v", name, r.Trailer, kept)
		}
	})
}
