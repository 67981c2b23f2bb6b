package policy

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Endpoint protocols, as the wire names them.
const (
	ProtoHTTP  = "http"
	ProtoHTTPS = "https"
	ProtoTLS   = "tls"
	ProtoTCP   = "tcp"
)

// kindProtos says which protocols each kind fits.
var kindProtos = map[string]string{
	KindCIDRAllow:       "http https tls tcp",
	KindCIDRDeny:        "http https tls tcp",
	KindRateLimit:       "http https tls tcp",
	KindBasicAuth:       "http https",
	KindRequestHeaders:  "http https",
	KindResponseHeaders: "http https",
	KindWebhook:         "http https",
	KindOIDC:            "https", // cookies must be Secure
	KindMutualTLS:       "https", // the edge terminates TLS
	PhaseTCPConnect:     "tls tcp",
	PhaseHTTPRequest:    "http https",
	PhaseHTTPResponse:   "http https",
}

// Fits reports whether kind applies to endpoints of protocol proto.
func Fits(kind, proto string) bool {
	for p := range strings.FieldsSeq(kindProtos[kind]) {
		if p == proto {
			return true
		}
	}
	return false
}

// Validate checks s for an endpoint of protocol proto (ProtoHTTP, ProtoHTTPS,
// ProtoTLS, ProtoTCP): every kind fits proto (ErrProtocol), no kinds clash,
// every value is well formed (ErrInvalid) and within the bounds
// (ErrTooLarge). The first fault found is returned. An agent validates its
// spec before it binds; Combine and Compile validate again.
func (s *Spec) Validate(proto string) error {
	switch proto {
	case ProtoHTTP, ProtoHTTPS, ProtoTLS, ProtoTCP:
	default:
		return fmt.Errorf("%w: unknown protocol %s", ErrProtocol, quote(proto))
	}
	if s == nil {
		return nil
	}
	for _, k := range s.Kinds() {
		if !Fits(k, proto) {
			return fmt.Errorf("%w: %s is not for %s endpoints (only %s)", ErrProtocol, k, proto, kindProtos[k])
		}
	}
	if s.OIDC != nil && s.BasicAuth != nil {
		return fmt.Errorf("%w: %s and %s together: a request carries one login", ErrProtocol, KindOIDC, KindBasicAuth)
	}
	if s.OIDC != nil && s.Webhook != nil {
		return fmt.Errorf("%w: %s and %s together: a webhook sender cannot log in", ErrProtocol, KindOIDC, KindWebhook)
	}
	checks := []func() error{
		func() error { return validCIDRs(KindCIDRAllow, s.CIDRAllow) },
		func() error { return validCIDRs(KindCIDRDeny, s.CIDRDeny) },
		func() error { return s.BasicAuth.validate() },
		func() error { return s.OIDC.validate() },
		func() error { return s.MutualTLS.validate() },
		func() error { return s.RateLimit.validate() },
		func() error { return s.RequestHeaders.validate(KindRequestHeaders, reservedRequest) },
		func() error { return s.ResponseHeaders.validate(KindResponseHeaders, reservedResponse) },
		func() error { return s.Webhook.validate() },
		func() error { return s.validateRules(proto) },
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func validCIDRs(kind string, ps []netip.Prefix) error {
	if len(ps) > MaxCIDRs {
		return fmt.Errorf("%w: %s: %d prefixes (at most %d)", ErrTooLarge, kind, len(ps), MaxCIDRs)
	}
	for i, p := range ps {
		if !p.IsValid() {
			return fmt.Errorf("%w: %s[%d]: not a CIDR prefix", ErrInvalid, kind, i)
		}
	}
	return nil
}

func (b *BasicAuth) validate() error {
	if b == nil {
		return nil
	}
	switch n := len(b.Credentials); {
	case n == 0:
		return fmt.Errorf("%w: %s: no credentials", ErrInvalid, KindBasicAuth)
	case n > MaxCredentials:
		return fmt.Errorf("%w: %s: %d credentials (at most %d)", ErrTooLarge, KindBasicAuth, n, MaxCredentials)
	}
	users := make(map[string]bool, len(b.Credentials))
	for i, c := range b.Credentials {
		// Never quote a credential: it holds a password.
		if len(c) > MaxCredentialBytes {
			return fmt.Errorf("%w: %s: credential %d: %d bytes (at most %d)", ErrTooLarge, KindBasicAuth, i, len(c), MaxCredentialBytes)
		}
		user, pass, ok := strings.Cut(c, ":")
		if !ok || user == "" || pass == "" {
			return fmt.Errorf("%w: %s: credential %d: want user:password, neither empty", ErrInvalid, KindBasicAuth, i)
		}
		if hasCTL(c) {
			return fmt.Errorf("%w: %s: credential %d: control character", ErrInvalid, KindBasicAuth, i)
		}
		if users[user] {
			return fmt.Errorf("%w: %s: user %s given twice", ErrInvalid, KindBasicAuth, quote(user))
		}
		users[user] = true
	}
	return nil
}

func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

func (o *OIDC) validate() error {
	if o == nil {
		return nil
	}
	return o.validateLogin(false)
}

// validateLogin checks o; anyone lets its allow lists be empty (an oidc
// action, whose later rules say who may in).
func (o *OIDC) validateLogin(anyone bool) error {
	if len(o.Issuer) > MaxURLBytes {
		return fmt.Errorf("%w: %s: issuer of %d bytes (at most %d)", ErrTooLarge, KindOIDC, len(o.Issuer), MaxURLBytes)
	}
	u, err := url.Parse(o.Issuer)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || hasCTL(o.Issuer) {
		return fmt.Errorf("%w: %s: issuer %s: want an https URL without query or fragment", ErrInvalid, KindOIDC, quote(o.Issuer))
	}
	switch {
	case o.ClientID == "":
		return fmt.Errorf("%w: %s: no client_id", ErrInvalid, KindOIDC)
	case len(o.ClientID) > MaxIDBytes:
		return fmt.Errorf("%w: %s: client_id of %d bytes (at most %d)", ErrTooLarge, KindOIDC, len(o.ClientID), MaxIDBytes)
	case hasCTL(o.ClientID):
		return fmt.Errorf("%w: %s: client_id: control character", ErrInvalid, KindOIDC)
	case len(o.ClientSecret) > MaxSecretBytes:
		return fmt.Errorf("%w: %s: client_secret of %d bytes (at most %d)", ErrTooLarge, KindOIDC, len(o.ClientSecret), MaxSecretBytes)
	}
	n := len(o.AllowEmails) + len(o.AllowDomains)
	switch {
	case n == 0 && !anyone:
		return fmt.Errorf("%w: %s: say who may log in (allow_emails or allow_domains)", ErrInvalid, KindOIDC)
	case n > MaxOIDCAllow:
		return fmt.Errorf("%w: %s: %d allowed e-mails and domains (at most %d)", ErrTooLarge, KindOIDC, n, MaxOIDCAllow)
	}
	for _, e := range o.AllowEmails {
		local, domain, ok := strings.Cut(e, "@")
		if len(e) > MaxIDBytes || !ok || local == "" || !validDomain(domain) || hasCTL(local) || strings.ContainsAny(local, " @") {
			return fmt.Errorf("%w: %s: allow_emails: %s is not an e-mail address", ErrInvalid, KindOIDC, quote(e))
		}
	}
	for _, d := range o.AllowDomains {
		if !validDomain(d) {
			return fmt.Errorf("%w: %s: allow_domains: %s is not a domain", ErrInvalid, KindOIDC, quote(d))
		}
	}
	return nil
}

// validDomain reports whether d looks like a DNS name: dot-separated labels
// of letters, digits and hyphens (IDNs in their xn-- form).
func validDomain(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i] | 0x20
			if !(c >= 'a' && c <= 'z' || label[i] >= '0' && label[i] <= '9' || label[i] == '-') {
				return false
			}
		}
	}
	return true
}

func (m *MutualTLS) validate() error {
	if m == nil {
		return nil
	}
	_, err := parseCAs(m.CAs)
	return err
}

// parseCAs parses mutual_tls's PEM text.
func parseCAs(text string) ([]*x509.Certificate, error) {
	if len(text) > MaxPEMBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes of PEM (at most %d)", ErrTooLarge, KindMutualTLS, len(text), MaxPEMBytes)
	}
	var cas []*x509.Certificate
	rest := []byte(text)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: %s: a %s block: want CERTIFICATE blocks only", ErrInvalid, KindMutualTLS, quote(block.Type))
		}
		if len(cas) == MaxCAs {
			return nil, fmt.Errorf("%w: %s: more than %d certificates", ErrTooLarge, KindMutualTLS, MaxCAs)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: certificate %d: %v", ErrInvalid, KindMutualTLS, len(cas), err)
		}
		cas = append(cas, c)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, fmt.Errorf("%w: %s: text that is not PEM", ErrInvalid, KindMutualTLS)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("%w: %s: no certificate", ErrInvalid, KindMutualTLS)
	}
	return cas, nil
}

func (r *RateLimit) validate() error {
	if r == nil {
		return nil
	}
	if r.Requests < 1 || r.Requests > MaxRateRequests {
		return fmt.Errorf("%w: %s: %d requests: want 1 to %d", ErrInvalid, KindRateLimit, r.Requests, MaxRateRequests)
	}
	if r.Seconds < 0 || r.Seconds > MaxRateSeconds {
		return fmt.Errorf("%w: %s: %d seconds: want 1 to %d (0: 1)", ErrInvalid, KindRateLimit, r.Seconds, MaxRateSeconds)
	}
	return nil
}

// perSecond is the rate r refills at.
func (r *RateLimit) perSecond() float64 {
	return float64(r.Requests) / float64(max(r.Seconds, 1))
}

// Headers no policy may touch, and why:
//   - Host and :authority route the request (and the app's virtual hosts);
//   - hop-by-hop headers (RFC 9110 7.6.1) and Content-Length frame the
//     message on each hop; changing them breaks or smuggles requests;
//   - X-Forwarded-For/-Proto/-Host and Forwarded are written by the edge
//     after the policy, exactly one hop, which apps trust;
//   - Tunnelkit-* are the edge's: identity headers the app trusts, and
//     the Tunnelkit-Error code of refusals.
var (
	reservedRequest = map[string]bool{
		"Host": true, "Content-Length": true,
		"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
		"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
		"Proxy-Authorization": true, "Proxy-Authenticate": true,
		"X-Forwarded-For": true, "X-Forwarded-Proto": true, "X-Forwarded-Host": true, "Forwarded": true,
	}
	reservedResponse = map[string]bool{
		"Content-Length": true,
		"Connection":     true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
		"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
		"Proxy-Authorization": true, "Proxy-Authenticate": true,
	}
)

// ReservedPrefix starts the names of the headers the edge owns: a policy may
// not set or remove them, and every incoming request header and trailer
// whose name reads as one with this prefix (however spelled: see
// Policy.Check) is removed before the request goes on to the app.
const ReservedPrefix = "Tunnelkit-"

func (h *Headers) validate(kind string, reserved map[string]bool) error {
	if h == nil {
		return nil
	}
	if len(h.Add) > MaxHeaderOps || len(h.Remove) > MaxHeaderOps {
		return fmt.Errorf("%w: %s: %d to add, %d to remove (at most %d each)", ErrTooLarge, kind, len(h.Add), len(h.Remove), MaxHeaderOps)
	}
	size := 0
	for _, a := range h.Add {
		size += len(a)
		name, value, ok := strings.Cut(a, ":")
		if !ok {
			return fmt.Errorf("%w: %s: add %s: want Name: value", ErrInvalid, kind, quote(a))
		}
		if err := allowedHeader(kind, name, reserved); err != nil {
			return err
		}
		if v := strings.TrimSpace(value); !httpguts.ValidHeaderFieldValue(v) {
			return fmt.Errorf("%w: %s: add %s: invalid value", ErrInvalid, kind, quote(name))
		}
	}
	if size > MaxHeaderBytes {
		return fmt.Errorf("%w: %s: %d bytes to add (at most %d)", ErrTooLarge, kind, size, MaxHeaderBytes)
	}
	for _, name := range h.Remove {
		if err := allowedHeader(kind, name, reserved); err != nil {
			return err
		}
	}
	return nil
}

func allowedHeader(kind, name string, reserved map[string]bool) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("%w: %s: %s is not a header name", ErrInvalid, kind, quote(name))
	}
	c := http.CanonicalHeaderKey(name)
	// Apps read '_' and '.' as '-' (see Check): a request may not get
	// another spelling of a forwarding header, nor any message another
	// spelling of a Tunnelkit-* name.
	k := kindOfName(c)
	lookalike := k == nameForwarding && kind == KindRequestHeaders && !canonicalName(c)
	if reserved[c] || k == nameOwn || lookalike {
		return fmt.Errorf("%w: %s: %s may not be changed (the edge owns it)", ErrInvalid, kind, c)
	}
	return nil
}

func (w *Webhook) validate() error {
	if w == nil {
		return nil
	}
	switch w.Provider {
	case WebhookGitHub, WebhookStripe, WebhookSlack:
	default:
		return fmt.Errorf("%w: %s: provider %s: want %s, %s or %s", ErrInvalid, KindWebhook, quote(w.Provider), WebhookGitHub, WebhookStripe, WebhookSlack)
	}
	switch {
	case w.Secret == "":
		return fmt.Errorf("%w: %s: no secret", ErrInvalid, KindWebhook)
	case len(w.Secret) > MaxSecretBytes:
		return fmt.Errorf("%w: %s: secret of %d bytes (at most %d)", ErrTooLarge, KindWebhook, len(w.Secret), MaxSecretBytes)
	}
	return nil
}
