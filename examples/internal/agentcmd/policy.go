package agentcmd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tunnelkit/tunnelkit/examples/internal/yamlcfg"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/policy/rules"
)

// listFlag collects the values of a flag that may repeat.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// policyFlags are the flags of the endpoint's traffic policy.
type policyFlags struct {
	cidrAllow, cidrDeny               listFlag
	basicAuth                         listFlag
	basicAuthPass                     bool
	oidcIssuer, oidcClientID, oidcSec string
	oidcEmails, oidcDomains           listFlag
	mutualTLSCAs                      string
	rateLimit                         string
	reqAdd, reqRemove                 listFlag
	respAdd, respRemove               listFlag
	webhook, webhookSecret            string
	file                              string
}

func (pf *policyFlags) register(fs *flag.FlagSet) {
	fs.Var(&pf.cidrAllow, "cidr-allow", "traffic policy: let in only clients in this CIDR prefix or address (repeat for more; all URLs)")
	fs.Var(&pf.cidrDeny, "cidr-deny", "traffic policy: refuse clients in this CIDR prefix or address (repeat for more; wins over -cidr-allow; all URLs)")
	fs.Var(&pf.basicAuth, "basic-auth", "traffic policy: a user:password that HTTP basic authentication lets in (repeat for more; http and https URLs)")
	fs.BoolVar(&pf.basicAuthPass, "basic-auth-pass", false, "with -basic-auth, pass the client's Authorization header on to the app (default: removed; the app gets the user in the Tunnelkit-Auth-User header)")
	fs.StringVar(&pf.oidcIssuer, "oidc-issuer", "", "traffic policy: make people log in at this OpenID provider (its https issuer URL; https URLs), registered with the redirect URI https://HOST/.tunnelkit/oidc/callback")
	fs.StringVar(&pf.oidcClientID, "oidc-client-id", "", "with -oidc-issuer, the client id registered at the provider")
	fs.StringVar(&pf.oidcSec, "oidc-client-secret", "", "with -oidc-issuer, the client's secret (empty: a public client)")
	fs.Var(&pf.oidcEmails, "oidc-allow-email", "with -oidc-issuer, an e-mail address that may log in (repeat for more)")
	fs.Var(&pf.oidcDomains, "oidc-allow-domain", "with -oidc-issuer, a domain whose e-mail addresses may log in (repeat for more)")
	fs.StringVar(&pf.mutualTLSCAs, "mutual-tls-cas", "", "traffic policy: PEM file of the CAs whose client certificates are let in (https URLs)")
	fs.StringVar(&pf.rateLimit, "rate-limit", "", "traffic policy: N/s, N/m or N/h: requests (http, https) or connections (tls, tcp) per client address (IPv6: per /64), in bursts of N")
	fs.Var(&pf.reqAdd, "request-header-add", "traffic policy: 'Name: value' to set on requests to the app (repeat for more; http and https URLs)")
	fs.Var(&pf.reqRemove, "request-header-remove", "traffic policy: a header to remove from requests to the app (repeat for more)")
	fs.Var(&pf.respAdd, "response-header-add", "traffic policy: 'Name: value' to set on responses from the app (repeat for more)")
	fs.Var(&pf.respRemove, "response-header-remove", "traffic policy: a header to remove from responses from the app (repeat for more)")
	fs.StringVar(&pf.webhook, "verify-webhook", "", "traffic policy: accept only requests signed by this webhook provider: github, stripe or slack (http and https URLs)")
	fs.StringVar(&pf.webhookSecret, "verify-webhook-secret", "", "with -verify-webhook, the provider's signing secret")
	fs.StringVar(&pf.file, "traffic-policy-file", "", "traffic policy: a YAML or JSON file of rules (on_tcp_connect, on_http_request, on_http_response, as ngrok's --traffic-policy-file takes) and kinds, with the flags above; a kind given by a flag and the file is an error")
}

// spec returns the policy the flags declare; nil for none. readFile reads
// -mutual-tls-cas.
func (pf *policyFlags) spec(readFile func(string) ([]byte, error)) (*policy.Spec, error) {
	var s policy.Spec
	var err error
	if s.CIDRAllow, err = parsePrefixes("-cidr-allow", pf.cidrAllow); err != nil {
		return nil, err
	}
	if s.CIDRDeny, err = parsePrefixes("-cidr-deny", pf.cidrDeny); err != nil {
		return nil, err
	}
	if len(pf.basicAuth) > 0 {
		s.BasicAuth = &policy.BasicAuth{Credentials: pf.basicAuth, PassAuthorization: pf.basicAuthPass}
	} else if pf.basicAuthPass {
		return nil, errors.New("-basic-auth-pass: only with -basic-auth")
	}
	switch {
	case pf.oidcIssuer != "":
		s.OIDC = &policy.OIDC{
			Issuer:       pf.oidcIssuer,
			ClientID:     pf.oidcClientID,
			ClientSecret: pf.oidcSec,
			AllowEmails:  pf.oidcEmails,
			AllowDomains: pf.oidcDomains,
		}
	case pf.oidcClientID != "" || pf.oidcSec != "" || len(pf.oidcEmails)+len(pf.oidcDomains) > 0:
		return nil, errors.New("-oidc-client-id, -oidc-client-secret, -oidc-allow-email, -oidc-allow-domain: only with -oidc-issuer")
	}
	if pf.mutualTLSCAs != "" {
		pem, err := readFile(pf.mutualTLSCAs)
		if err != nil {
			return nil, fmt.Errorf("-mutual-tls-cas: %w", err)
		}
		s.MutualTLS = &policy.MutualTLS{CAs: string(pem)}
	}
	if pf.rateLimit != "" {
		if s.RateLimit, err = parseRate(pf.rateLimit); err != nil {
			return nil, err
		}
	}
	if len(pf.reqAdd)+len(pf.reqRemove) > 0 {
		s.RequestHeaders = &policy.Headers{Add: pf.reqAdd, Remove: pf.reqRemove}
	}
	if len(pf.respAdd)+len(pf.respRemove) > 0 {
		s.ResponseHeaders = &policy.Headers{Add: pf.respAdd, Remove: pf.respRemove}
	}
	switch {
	case pf.webhook != "" && pf.webhookSecret == "":
		return nil, errors.New("-verify-webhook: needs -verify-webhook-secret")
	case pf.webhook != "":
		s.Webhook = &policy.Webhook{Provider: pf.webhook, Secret: pf.webhookSecret}
	case pf.webhookSecret != "":
		return nil, errors.New("-verify-webhook-secret: only with -verify-webhook")
	}
	if pf.file != "" {
		f, err := yamlcfg.Load(pf.file, nil)
		if err != nil {
			return nil, fmt.Errorf("-traffic-policy-file: %w", err)
		}
		fromFile, err := f.Policy(f.Root)
		if err != nil {
			return nil, fmt.Errorf("-traffic-policy-file: %w", err)
		}
		if fromFile != nil {
			if s, err = mergeSpecs(s, *fromFile); err != nil {
				return nil, err
			}
		}
	}
	if s.IsZero() {
		return nil, nil
	}
	return &s, nil
}

// mergeSpecs puts the kinds and phases of the flags' spec and the file's
// together; one that both set is an error.
func mergeSpecs(flags, file policy.Spec) (policy.Spec, error) {
	a, _ := json.Marshal(flags)
	b, _ := json.Marshal(file)
	var ma, mb map[string]json.RawMessage
	json.Unmarshal(a, &ma)
	json.Unmarshal(b, &mb)
	for k, v := range mb {
		if _, both := ma[k]; both {
			return policy.Spec{}, fmt.Errorf("-traffic-policy-file: %s is given by a flag too: give it once", k)
		}
		ma[k] = v
	}
	merged, _ := json.Marshal(ma)
	return policy.Parse(merged)
}

// parsePrefixes reads CIDR prefixes; an address alone is its /32 or /128.
func parsePrefixes(flag string, vals []string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for _, v := range vals {
		if a, err := netip.ParseAddr(v); err == nil {
			ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("%s %q: want a CIDR prefix (10.0.0.0/8, 2001:db8::/32) or an address", flag, v)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// parseRate reads N/s, N/m or N/h.
func parseRate(v string) (*policy.RateLimit, error) {
	n, unit, ok := strings.Cut(v, "/")
	requests, err := strconv.Atoi(n)
	seconds := map[string]int{"s": 1, "m": 60, "h": 3600}[unit]
	if !ok || err != nil || requests < 1 || seconds == 0 {
		return nil, fmt.Errorf("-rate-limit %q: want N/s, N/m or N/h, N at least 1", v)
	}
	return &policy.RateLimit{Requests: requests, Seconds: seconds}, nil
}

// checkRules compiles the expressions of s's rules for an endpoint of
// proto as the edge will, so that a CEL error is found when the agent
// reads its settings, naming the file's line, rather than at the bind.
// What only the edge can set up (jwt-validation's keys, an oidc login's
// provider) is left to it.
func checkRules(proto string, s *policy.Spec) error {
	own := s.Rules()
	if own.IsZero() {
		return nil
	}
	_, err := policy.Compile(context.Background(), proto, own, policy.Options{Engine: expressionsOnly{}})
	if errors.Is(err, policy.ErrUnsupported) {
		return nil
	}
	return err
}

// expressionsOnly is the rules engine without what reaches the network.
type expressionsOnly struct{ e rules.Engine }

func (x expressionsOnly) Bool(phase, expr string) (policy.BoolProgram, error) {
	return x.e.Bool(phase, expr)
}

func (x expressionsOnly) String(phase, expr string) (policy.StringProgram, error) {
	return x.e.String(phase, expr)
}

func (x expressionsOnly) All(phase string, exprs []string) (policy.BoolProgram, error) {
	return x.e.All(phase, exprs)
}
