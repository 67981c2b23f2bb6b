package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// JWTValidation is the config of a jwt-validation action, as ngrok writes
// it: a request goes on only with a token signed by a key of the JWKS
// URLs, from an allowed issuer, for an allowed audience, within its
// times. The Engine validates it (JWTEngine); package policy checks the
// config and finds the token.
type JWTValidation struct {
	// Issuer's allow list: the "iss" claim must be one of them, exactly.
	Issuer JWTAllowList `json:"issuer"`

	// Audience's allow list: the "aud" claim must hold one of them.
	Audience JWTAllowList `json:"audience"`

	// HTTP says where tokens are. None: the Authorization header, after
	// "Bearer ".
	HTTP JWTHTTP `json:"http,omitempty"`

	// JWS says how tokens are signed.
	JWS JWTJWS `json:"jws"`
}

// JWTAllowList is a list of values a claim may have.
type JWTAllowList struct {
	AllowList []JWTValue `json:"allow_list"`
}

// JWTValue is one value of an allow list.
type JWTValue struct {
	Value string `json:"value"`
}

// JWTHTTP lists where a request's token may be.
type JWTHTTP struct {
	Tokens []JWTToken `json:"tokens,omitempty"`
}

// JWTToken is a place of a token: a header (Name, after Prefix, such as
// "Bearer ") or a cookie (Name).
type JWTToken struct {
	Type   string `json:"type,omitempty"`   // "jwt" (the default)
	Method string `json:"method,omitempty"` // "header" (the default) or "cookie"
	Name   string `json:"name,omitempty"`   // default: Authorization
	Prefix string `json:"prefix,omitempty"` // default, for Authorization: "Bearer "
}

// JWTJWS says which algorithms and keys sign tokens.
type JWTJWS struct {
	AllowedAlgorithms []string `json:"allowed_algorithms"`
	Keys              JWTKeys  `json:"keys"`
}

// JWTKeys says where the keys are.
type JWTKeys struct {
	Sources JWTSources `json:"sources"`
}

// JWTSources are the JWKS URLs (https) of the keys.
type JWTSources struct {
	AdditionalJKUs []string `json:"additional_jkus"`
}

// The algorithms jwt-validation takes: public-key ones only. "none" and
// the HMAC ones (HS256...) are refused: a key published as a public one
// must never serve as a shared secret (algorithm confusion).
var jwtAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// The bounds of a jwt-validation.
const (
	MaxJWTAllowed = 16 // values of each allow list, tokens, JWKS URLs
)

func (c *JWTValidation) validate(at string) error {
	lists := []struct {
		name string
		l    []JWTValue
	}{{"issuer.allow_list", c.Issuer.AllowList}, {"audience.allow_list", c.Audience.AllowList}}
	for _, l := range lists {
		if len(l.l) == 0 {
			return fmt.Errorf("%w: %s: %s: at least one value", ErrInvalid, at, l.name)
		}
		if len(l.l) > MaxJWTAllowed {
			return fmt.Errorf("%w: %s: %s: %d values (at most %d)", ErrTooLarge, at, l.name, len(l.l), MaxJWTAllowed)
		}
		for _, v := range l.l {
			if v.Value == "" || len(v.Value) > MaxURLBytes || hasCTL(v.Value) {
				return fmt.Errorf("%w: %s: %s: a value empty, over %d bytes or with control characters", ErrInvalid, at, l.name, MaxURLBytes)
			}
		}
	}
	if len(c.HTTP.Tokens) > MaxJWTAllowed {
		return fmt.Errorf("%w: %s: http.tokens: %d (at most %d)", ErrTooLarge, at, len(c.HTTP.Tokens), MaxJWTAllowed)
	}
	for i, t := range c.HTTP.Tokens {
		tat := fmt.Sprintf("%s: http.tokens[%d]", at, i)
		if t.Type != "" && t.Type != "jwt" {
			return fmt.Errorf("%w: %s: type %s: want jwt", ErrInvalid, tat, quote(t.Type))
		}
		switch t.Method {
		case "", "header":
			if t.Name != "" && !httpguts.ValidHeaderFieldName(t.Name) {
				return fmt.Errorf("%w: %s: %s is not a header name", ErrInvalid, tat, quote(t.Name))
			}
		case "cookie":
			if t.Name == "" || !httpguts.ValidHeaderFieldName(t.Name) {
				return fmt.Errorf("%w: %s: a cookie's name", ErrInvalid, tat)
			}
		default:
			return fmt.Errorf("%w: %s: method %s: want header or cookie", ErrInvalid, tat, quote(t.Method))
		}
		if len(t.Prefix) > 64 || hasCTL(t.Prefix) {
			return fmt.Errorf("%w: %s: prefix", ErrInvalid, tat)
		}
	}
	algs := c.JWS.AllowedAlgorithms
	if len(algs) == 0 {
		return fmt.Errorf("%w: %s: jws.allowed_algorithms: at least one", ErrInvalid, at)
	}
	for _, a := range algs {
		if !slices.Contains(jwtAlgorithms, a) {
			why := "not a public-key algorithm"
			switch {
			case strings.EqualFold(a, "none"):
				why = "unsigned tokens are never accepted"
			case strings.HasPrefix(strings.ToUpper(a), "HS"):
				why = "HMAC would take a public key for a shared secret"
			}
			return fmt.Errorf("%w: %s: jws.allowed_algorithms: %s: %s (take %s)", ErrInvalid, at, quote(a), why, strings.Join(jwtAlgorithms, ", "))
		}
	}
	jkus := c.JWS.Keys.Sources.AdditionalJKUs
	if len(jkus) == 0 {
		return fmt.Errorf("%w: %s: jws.keys.sources.additional_jkus: at least one JWKS URL", ErrInvalid, at)
	}
	if len(jkus) > MaxJWTAllowed {
		return fmt.Errorf("%w: %s: jws.keys.sources.additional_jkus: %d (at most %d)", ErrTooLarge, at, len(jkus), MaxJWTAllowed)
	}
	for _, u := range jkus {
		if err := checkJKU(u); err != nil {
			return fmt.Errorf("%w: %s: jws.keys.sources.additional_jkus: %s: %v", ErrInvalid, at, quote(u), err)
		}
	}
	return nil
}

// checkJKU checks a JWKS URL's form: https, a host, no user.
func checkJKU(raw string) error {
	if len(raw) > MaxURLBytes {
		return fmt.Errorf("over %d bytes", MaxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.Fragment != "" {
		return errors.New("want an https URL with a host, without a user or a fragment")
	}
	return nil
}

// PrivateJKU reports whether a JWKS URL names a host that is not public
// by its form (an IP address that is not a public one, or localhost); a
// name that resolves to one is refused when dialled.
func PrivateJKU(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return true
	}
	h := strings.ToLower(u.Hostname())
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	if err != nil {
		return false
	}
	return !PublicAddr(a)
}

// PublicAddr reports whether a is an address of the public Internet: not
// loopback, private (RFC 1918, ULA), link-local, carrier-grade NAT (RFC
// 6598), "this network" (0.0.0.0/8), multicast or unspecified. What the
// edge fetches for a tenant (an OIDC issuer, a JWKS) is only dialled at
// such an address, unless the operator allows private ones.
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsGlobalUnicast() && !a.IsPrivate() && !cgnat.Contains(a) && !thisNet.Contains(a)
}

var (
	cgnat   = netip.MustParsePrefix("100.64.0.0/10") // RFC 6598
	thisNet = netip.MustParsePrefix("0.0.0.0/8")     // RFC 791
)

// JWTEngine is an Engine that validates JWTs: without it, a
// jwt-validation action is refused with ErrUnsupported.
type JWTEngine interface {
	// JWT compiles a validated config, once per bind; an error wrapping
	// ErrForbidden refuses it (a JWKS URL the edge may not fetch).
	JWT(cfg *JWTValidation) (JWTVerifier, error)
}

// JWTVerifier checks a token at now and returns its claims. An error
// wrapping ErrUnavailable means the keys could not be had (the request is
// answered 503: fail closed); any other, that the token is not valid.
type JWTVerifier func(ctx context.Context, token string, now time.Time) (claims map[string]any, err error)

// jwtAct is a compiled jwt-validation.
type jwtAct struct {
	verify JWTVerifier
	tokens []JWTToken
}

// MaxJWTBytes bounds a token the edge looks at.
const MaxJWTBytes = 16 << 10

var (
	refusedNoToken  = Refusal{http.StatusUnauthorized, CodeUnauthorized, "this endpoint needs a bearer token"}
	refusedBadToken = Refusal{http.StatusUnauthorized, CodeUnauthorized, "the bearer token is not valid here"}
	refusedNoKeys   = Refusal{http.StatusServiceUnavailable, CodePolicyUnavailable, "the keys that verify tokens cannot be fetched now; try again later"}
)

func (a *jwtAct) run(x *run) (bool, error) {
	token := ""
	for _, t := range a.tokens {
		if t.Method == "cookie" {
			if c, err := x.r.Cookie(t.Name); err == nil {
				token = c.Value
			}
		} else if v := x.r.Header.Get(t.Name); v != "" {
			if len(v) >= len(t.Prefix) && strings.EqualFold(v[:len(t.Prefix)], t.Prefix) {
				token = strings.TrimSpace(v[len(t.Prefix):])
			}
		}
		if token != "" {
			break
		}
	}
	if token == "" || len(token) > MaxJWTBytes {
		x.w.Header().Set("WWW-Authenticate", `Bearer`)
		x.refuse(refusedNoToken)
		return true, nil
	}
	claims, err := a.verify(x.r.Context(), token, x.vars.Now)
	switch {
	case errors.Is(err, ErrUnavailable):
		x.p.failed(err, "host", x.r.Host)
		x.refuse(refusedNoKeys)
		return true, nil
	case err != nil:
		x.p.log.Debug("policy: a token refused", "host", x.r.Host, "err", err)
		x.w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		x.refuse(refusedBadToken)
		return true, nil
	}
	x.vars.JWT = claims
	return false, nil
}

// jwks returns the JWKS URLs of s's jwt-validation actions.
func (s *Spec) jwks() []string {
	var urls []string
	for c := range configsOf[*JWTValidation](s, ActionJWTValidation) {
		urls = append(urls, c.JWS.Keys.Sources.AdditionalJKUs...)
	}
	return urls
}

// sameOrigin reports whether a and b are URLs of one scheme, host and
// port.
func sameOrigin(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Scheme == ub.Scheme && strings.EqualFold(ua.Host, ub.Host)
}

// oidcIssuers returns the issuers of s's oidc actions.
func (s *Spec) oidcIssuers() []string {
	var out []string
	for c := range configsOf[*oidcActionConfig](s, ActionOIDC) {
		out = append(out, c.IssuerURL)
	}
	return out
}
