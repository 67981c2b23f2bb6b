package policy

import (
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
)

// The kinds of policy: the JSON field names of a Spec, the names its
// errors use.
const (
	KindCIDRAllow       = "cidr_allow"
	KindCIDRDeny        = "cidr_deny"
	KindBasicAuth       = "basic_auth"
	KindOIDC            = "oidc"
	KindMutualTLS       = "mutual_tls"
	KindRateLimit       = "rate_limit"
	KindRequestHeaders  = "request_headers"
	KindResponseHeaders = "response_headers"
	KindWebhook         = "webhook"
)

// Webhook providers (Webhook.Provider).
const (
	WebhookGitHub = "github" // X-Hub-Signature-256: sha256=HMAC-SHA256(secret, body)
	WebhookStripe = "stripe" // Stripe-Signature: t=T,v1=HMAC-SHA256(secret, T "." body)
	WebhookSlack  = "slack"  // X-Slack-Signature: v0=HMAC-SHA256(secret, "v0:" T ":" body)
)

// The bounds of a spec. Validate (and so Combine and Compile) refuses a spec
// beyond any of them with ErrTooLarge, so that a bind costs the edge bounded
// memory and every request bounded work. They hold for a combined spec too:
// an operator's lists and an agent's together.
const (
	// MaxSpecBytes bounds a spec's JSON form: what Parse reads and what an
	// agent may send in a bind (a bind is at most 64 KiB in all).
	MaxSpecBytes = 48 << 10

	// MaxCIDRs bounds each of cidr_allow and cidr_deny. Matching costs
	// O(log n) whatever the size.
	MaxCIDRs = 10000

	// MaxCredentials bounds basic_auth's user:password pairs (each
	// request is checked against all of them, in constant time).
	MaxCredentials = 100

	// MaxCredentialBytes bounds one "user:password" pair.
	MaxCredentialBytes = 256

	// MaxOIDCAllow bounds oidc's allow_emails and allow_domains together.
	MaxOIDCAllow = 500

	// MaxURLBytes bounds the OIDC issuer URL.
	MaxURLBytes = 2048

	// MaxIDBytes bounds an OIDC client id, an e-mail address or a domain.
	MaxIDBytes = 256

	// MaxSecretBytes bounds an OIDC client secret and a webhook secret.
	MaxSecretBytes = 512

	// MaxPEMBytes bounds mutual_tls's PEM text.
	MaxPEMBytes = 32 << 10

	// MaxCAs bounds the certificates in mutual_tls's PEM text.
	MaxCAs = 32

	// MaxRateRequests bounds rate_limit's requests per period; the period
	// is at most MaxRateSeconds.
	MaxRateRequests = 1_000_000
	MaxRateSeconds  = 3600

	// MaxHeaderOps bounds each of a header kind's add and remove lists.
	MaxHeaderOps = 64

	// MaxHeaderBytes bounds the bytes of one add list, names and values.
	MaxHeaderBytes = 8 << 10
)

// Spec is a traffic policy: plain data, what an agent declares with an
// endpoint and an operator sets for an edge. Its JSON form is the wire form
// (the "policy" member of a bind); Parse reads it strictly. The zero Spec
// is no policy. Every field is a kind; a nil or empty field is a kind left
// out. Which kinds fit which protocol, and the order in which a compiled
// Policy checks them, are in the package documentation.
type Spec struct {
	// CIDRAllow, when not empty, lets only clients whose address is in
	// one of its prefixes reach the endpoint (all protocols).
	CIDRAllow []netip.Prefix `json:"cidr_allow,omitempty"`

	// CIDRDeny refuses clients whose address is in one of its prefixes
	// (all protocols). Deny wins over allow.
	CIDRDeny []netip.Prefix `json:"cidr_deny,omitempty"`

	// BasicAuth asks HTTP clients for a user and password (http, https).
	BasicAuth *BasicAuth `json:"basic_auth,omitempty"`

	// OIDC makes people log in at an OpenID provider (https).
	OIDC *OIDC `json:"oidc,omitempty"`

	// MutualTLS asks clients for a certificate from one of its CAs
	// (https).
	MutualTLS *MutualTLS `json:"mutual_tls,omitempty"`

	// RateLimit bounds the requests (http, https) or connections (tls,
	// tcp) of each client address.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`

	// RequestHeaders changes the headers of requests on their way to the
	// app (http, https).
	RequestHeaders *Headers `json:"request_headers,omitempty"`

	// ResponseHeaders changes the headers of the app's responses (http,
	// https).
	ResponseHeaders *Headers `json:"response_headers,omitempty"`

	// Webhook accepts only requests signed by a webhook provider (http,
	// https).
	Webhook *Webhook `json:"webhook,omitempty"`

	// OnTCPConnect are the rules run on each connection (tls, tcp), after
	// the kinds.
	OnTCPConnect []Rule `json:"on_tcp_connect,omitempty"`

	// OnHTTPRequest are the rules run on each request (http, https),
	// after the kinds, before the app.
	OnHTTPRequest []Rule `json:"on_http_request,omitempty"`

	// OnHTTPResponse are the rules run on each response of the app
	// (http, https), before the response_headers kind.
	OnHTTPResponse []Rule `json:"on_http_response,omitempty"`
}

// BasicAuth is HTTP basic authentication (RFC 7617). A compiled Policy keeps
// no password in clear: only a keyed hash of each pair.
type BasicAuth struct {
	// Credentials are "user:password" pairs: the user up to the first
	// colon, neither empty, no control characters, each user once.
	Credentials []string `json:"credentials"`

	// PassAuthorization passes the client's Authorization header on to
	// the app. False: the app never sees it (it learns the user from the
	// Tunnelkit-Auth-User header).
	PassAuthorization bool `json:"pass_authorization,omitempty"`
}

// OIDC is an OpenID Connect login (authorization-code flow with PKCE) that
// the edge runs on the endpoint's own host, with its callback at
// CallbackPath. The app learns who logged in from the Tunnelkit-Auth-Email
// and Tunnelkit-Auth-Subject headers.
type OIDC struct {
	// Issuer is the provider's issuer URL (https), whose discovery
	// document is at Issuer + "/.well-known/openid-configuration".
	Issuer string `json:"issuer"`

	// ClientID and ClientSecret are the client registered at the
	// provider, with https://HOST/.tunnelkit/oidc/callback as a redirect
	// URI for every HOST of the endpoint. The secret may be empty for a
	// public client.
	ClientID     string `json:"client_id"`
	ClientSecret string `json:"client_secret,omitempty"`

	// AllowEmails and AllowDomains say who may in: a user whose verified
	// e-mail address is one of AllowEmails, or is at one of AllowDomains
	// (the part after the @, exactly; no subdomains). Both compare without
	// regard to case. At least one entry is required: "anyone the issuer
	// knows" is too easy to declare by mistake with a public issuer.
	AllowEmails  []string `json:"allow_emails,omitempty"`
	AllowDomains []string `json:"allow_domains,omitempty"`
}

// MutualTLS asks HTTPS clients for a certificate that chains to one of CAs.
// The app learns the certificate's subject from the
// Tunnelkit-Client-Cert-Subject header.
type MutualTLS struct {
	// CAs is PEM text: one or more CERTIFICATE blocks and nothing else.
	CAs string `json:"cas"`
}

// RateLimit is a token bucket per client address (an IPv4 address, or an
// IPv6 /64): Requests per Seconds, with a burst of Requests. A request (http,
// https) or a connection (tls, tcp) spends one token.
type RateLimit struct {
	// Requests is the bucket's size and what it refills per period: 1 to
	// MaxRateRequests.
	Requests int `json:"requests"`

	// Seconds is the period. Zero: one second. At most MaxRateSeconds.
	Seconds int `json:"seconds,omitempty"`
}

// Headers changes HTTP headers: Remove first, then Add.
type Headers struct {
	// Add holds "Name: value" entries. Each name's values replace any the
	// message had; a name listed twice gets both values.
	Add []string `json:"add,omitempty"`

	// Remove holds header names to remove.
	Remove []string `json:"remove,omitempty"`
}

// Webhook accepts only requests whose body a webhook provider signed with
// Secret. See the package documentation for the schemes.
type Webhook struct {
	Provider string `json:"provider"` // WebhookGitHub, WebhookStripe or WebhookSlack
	Secret   string `json:"secret"`
}

// IsZero reports whether s declares no kind and no rule.
func (s *Spec) IsZero() bool {
	return s == nil || len(s.Kinds()) == 0
}

// Kinds returns the kinds s declares, in the order of the Spec's fields;
// a phase with rules counts as a kind (Operator.Kinds caps them too).
func (s *Spec) Kinds() []string {
	if s == nil {
		return nil
	}
	var k []string
	add := func(set bool, kind string) {
		if set {
			k = append(k, kind)
		}
	}
	add(len(s.CIDRAllow) > 0, KindCIDRAllow)
	add(len(s.CIDRDeny) > 0, KindCIDRDeny)
	add(s.BasicAuth != nil, KindBasicAuth)
	add(s.OIDC != nil, KindOIDC)
	add(s.MutualTLS != nil, KindMutualTLS)
	add(s.RateLimit != nil, KindRateLimit)
	add(s.RequestHeaders != nil, KindRequestHeaders)
	add(s.ResponseHeaders != nil, KindResponseHeaders)
	add(s.Webhook != nil, KindWebhook)
	add(len(s.OnTCPConnect) > 0, PhaseTCPConnect)
	add(len(s.OnHTTPRequest) > 0, PhaseHTTPRequest)
	add(len(s.OnHTTPResponse) > 0, PhaseHTTPResponse)
	return k
}

// String lists the kinds s declares, with list sizes, and no secret: a
// Spec is safe to print and to log.
func (s Spec) String() string {
	var b strings.Builder
	b.WriteString("policy{")
	n := func(kind string, count int) {
		if b.Len() > len("policy{") {
			b.WriteByte(' ')
		}
		b.WriteString(kind)
		if count >= 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(count))
		}
	}
	if len(s.CIDRAllow) > 0 {
		n(KindCIDRAllow, len(s.CIDRAllow))
	}
	if len(s.CIDRDeny) > 0 {
		n(KindCIDRDeny, len(s.CIDRDeny))
	}
	if s.BasicAuth != nil {
		n(KindBasicAuth, len(s.BasicAuth.Credentials))
	}
	if s.OIDC != nil {
		n(KindOIDC, len(s.OIDC.AllowEmails)+len(s.OIDC.AllowDomains))
	}
	if s.MutualTLS != nil {
		n(KindMutualTLS, -1)
	}
	if s.RateLimit != nil {
		n(KindRateLimit, -1)
	}
	if s.RequestHeaders != nil {
		n(KindRequestHeaders, len(s.RequestHeaders.Add)+len(s.RequestHeaders.Remove))
	}
	if s.ResponseHeaders != nil {
		n(KindResponseHeaders, len(s.ResponseHeaders.Add)+len(s.ResponseHeaders.Remove))
	}
	if s.Webhook != nil {
		n(KindWebhook, -1)
	}
	for _, ph := range s.phases() {
		if len(ph.rules) > 0 {
			n(ph.name, len(ph.rules))
		}
	}
	b.WriteByte('}')
	return b.String()
}

// LogValue makes a Spec log as String does, without its secrets.
func (s Spec) LogValue() slog.Value { return slog.StringValue(s.String()) }
