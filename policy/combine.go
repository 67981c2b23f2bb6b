package policy

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// Operator is an operator's policy: what holds on every endpoint it is
// combined with (the whole edge, or one identity's endpoints), and what
// agents may declare. The zero Operator adds nothing and allows every kind.
type Operator struct {
	// Policy holds on every endpoint, whatever the agent declares, for the
	// kinds that fit the endpoint's protocol (the others are left out:
	// one operator policy serves http and tcp endpoints alike).
	Policy Spec

	// Kinds, when not nil, are the only kinds agents may declare; an agent
	// declaring another gets ErrForbidden. Nil: every kind.
	Kinds []string

	// Actions, when not nil, are the only action types agents' rules may
	// use; an agent's rule using another gets ErrForbidden. Nil: every
	// action. (Kinds caps the phases: a phase not in Kinds may hold no
	// agent's rule.)
	Actions []string

	// OIDCIssuers, when not nil, are the only issuer URLs (and the only
	// origins of jwt-validation's JWKS URLs) (compared
	// exactly) agents' oidc kinds may name; others get ErrForbidden. Nil:
	// any https issuer, which lets agents make the edge fetch any URL (see
	// package policy/oidc for what it fetches and how it is bounded).
	OIDCIssuers []string
}

// Combine validates agent for an endpoint of protocol proto against op's caps
// and returns the spec the edge compiles: op.Policy and agent together, by
// the rules in the package documentation (deny lists union, allow lists
// intersect, the lower rate limit, headers the operator's last, and at most
// one party setting basic_auth, oidc, mutual_tls or webhook: ErrConflict).
// The result is validated as a whole and shares no memory with its inputs.
func Combine(proto string, op Operator, agent Spec) (Spec, error) {
	if err := agent.Validate(proto); err != nil {
		return Spec{}, err
	}
	if op.Kinds != nil {
		for _, k := range agent.Kinds() {
			if !slices.Contains(op.Kinds, k) {
				return Spec{}, fmt.Errorf("%w: agents may not declare %s here", ErrForbidden, k)
			}
		}
	}
	if op.Actions != nil {
		for _, a := range agent.ActionTypes() {
			if !slices.Contains(op.Actions, a) {
				return Spec{}, fmt.Errorf("%w: agents may not use the action %s here", ErrForbidden, a)
			}
		}
	}
	if op.OIDCIssuers != nil {
		for _, u := range agent.jwks() {
			if !slices.ContainsFunc(op.OIDCIssuers, func(iss string) bool { return sameOrigin(iss, u) }) {
				return Spec{}, fmt.Errorf("%w: JWKS URL %s: not at an issuer the operator allows", ErrForbidden, quote(u))
			}
		}
	}
	if op.OIDCIssuers != nil {
		for _, iss := range agent.oidcIssuers() {
			if !slices.Contains(op.OIDCIssuers, iss) {
				return Spec{}, fmt.Errorf("%w: OIDC issuer %s", ErrForbidden, quote(iss))
			}
		}
	}
	if agent.OIDC != nil && op.OIDCIssuers != nil && !slices.Contains(op.OIDCIssuers, agent.OIDC.Issuer) {
		return Spec{}, fmt.Errorf("%w: OIDC issuer %s", ErrForbidden, quote(agent.OIDC.Issuer))
	}
	o := fitting(op.Policy, proto)
	if err := o.Validate(proto); err != nil {
		return Spec{}, fmt.Errorf("operator's policy: %w", err)
	}
	var out Spec
	out.CIDRDeny = unionPrefixes(o.CIDRDeny, agent.CIDRDeny)
	switch {
	case len(o.CIDRAllow) > 0 && len(agent.CIDRAllow) > 0:
		out.CIDRAllow = intersectPrefixes(o.CIDRAllow, agent.CIDRAllow)
		if len(out.CIDRAllow) == 0 {
			// Nobody is in both lists: nobody gets in. (An empty
			// allow list would mean no list.)
			out.CIDRDeny = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
		}
	case len(o.CIDRAllow) > 0:
		out.CIDRAllow = slices.Clone(o.CIDRAllow)
	case len(agent.CIDRAllow) > 0:
		out.CIDRAllow = slices.Clone(agent.CIDRAllow)
	}
	var err error
	if out.BasicAuth, err = one(KindBasicAuth, o.BasicAuth, agent.BasicAuth); err != nil {
		return Spec{}, err
	}
	if out.OIDC, err = one(KindOIDC, o.OIDC, agent.OIDC); err != nil {
		return Spec{}, err
	}
	if out.MutualTLS, err = one(KindMutualTLS, o.MutualTLS, agent.MutualTLS); err != nil {
		return Spec{}, err
	}
	if out.Webhook, err = one(KindWebhook, o.Webhook, agent.Webhook); err != nil {
		return Spec{}, err
	}
	switch a, b := o.RateLimit, agent.RateLimit; {
	case a != nil && b != nil:
		if b.perSecond() < a.perSecond() {
			a = b
		}
		out.RateLimit = new(*a)
	case a != nil:
		out.RateLimit = new(*a)
	case b != nil:
		out.RateLimit = new(*b)
	}
	out.RequestHeaders = combineHeaders(o.RequestHeaders, agent.RequestHeaders)
	out.ResponseHeaders = combineHeaders(o.ResponseHeaders, agent.ResponseHeaders)
	// The operator's rules first on the way in, last on the way out.
	out.OnTCPConnect = chain(o.OnTCPConnect, agent.OnTCPConnect)
	out.OnHTTPRequest = chain(o.OnHTTPRequest, agent.OnHTTPRequest)
	out.OnHTTPResponse = chain(agent.OnHTTPResponse, o.OnHTTPResponse)
	if out.BasicAuth != nil {
		out.BasicAuth.Credentials = slices.Clone(out.BasicAuth.Credentials)
	}
	if out.OIDC != nil {
		out.OIDC.AllowEmails = slices.Clone(out.OIDC.AllowEmails)
		out.OIDC.AllowDomains = slices.Clone(out.OIDC.AllowDomains)
	}
	if err := out.Validate(proto); err != nil {
		return Spec{}, fmt.Errorf("combined with the operator's policy: %w", err)
	}
	return out, nil
}

// fitting returns the kinds of s that fit proto.
func fitting(s Spec, proto string) Spec {
	if !Fits(KindCIDRAllow, proto) {
		s.CIDRAllow = nil
	}
	if !Fits(KindCIDRDeny, proto) {
		s.CIDRDeny = nil
	}
	if !Fits(KindBasicAuth, proto) {
		s.BasicAuth = nil
	}
	if !Fits(KindOIDC, proto) {
		s.OIDC = nil
	}
	if !Fits(KindMutualTLS, proto) {
		s.MutualTLS = nil
	}
	if !Fits(KindRateLimit, proto) {
		s.RateLimit = nil
	}
	if !Fits(KindRequestHeaders, proto) {
		s.RequestHeaders = nil
	}
	if !Fits(KindResponseHeaders, proto) {
		s.ResponseHeaders = nil
	}
	if !Fits(KindWebhook, proto) {
		s.Webhook = nil
	}
	if !Fits(PhaseTCPConnect, proto) {
		s.OnTCPConnect = nil
	}
	if !Fits(PhaseHTTPRequest, proto) {
		s.OnHTTPRequest = nil
	}
	if !Fits(PhaseHTTPResponse, proto) {
		s.OnHTTPResponse = nil
	}
	return s
}

// cloneRules copies rules, deep enough that the result shares no memory
// with them.
func cloneRules(rules []Rule) []Rule {
	out := make([]Rule, 0, len(rules))
	for _, r := range rules {
		c := Rule{Name: r.Name, Expressions: slices.Clone(r.Expressions)}
		for _, a := range r.Actions {
			c.Actions = append(c.Actions, Action{Type: a.Type, Config: slices.Clone(a.Config)})
		}
		out = append(out, c)
	}
	return out
}

// chain returns first's rules then then's, copied; nil for none.
func chain(first, then []Rule) []Rule {
	if len(first)+len(then) == 0 {
		return nil
	}
	return append(cloneRules(first), cloneRules(then)...)
}

// one returns a copy of whichever of op and agent is set; both is a
// conflict.
func one[T any](kind string, op, agent *T) (*T, error) {
	switch {
	case op != nil && agent != nil:
		return nil, fmt.Errorf("%w: %s", ErrConflict, kind)
	case op != nil:
		return new(*op), nil
	case agent != nil:
		return new(*agent), nil
	}
	return nil, nil
}

// combineHeaders applies the agent's changes, then the operator's: the
// operator's removals also cancel the agent's additions of those names.
func combineHeaders(op, agent *Headers) *Headers {
	if op == nil && agent == nil {
		return nil
	}
	var out Headers
	removed := map[string]bool{}
	for _, h := range []*Headers{agent, op} {
		if h == nil {
			continue
		}
		for _, name := range h.Remove {
			c := http.CanonicalHeaderKey(name)
			if !removed[c] {
				removed[c] = true
				out.Remove = append(out.Remove, c)
			}
		}
	}
	if agent != nil {
		opRemoves := map[string]bool{}
		if op != nil {
			for _, name := range op.Remove {
				opRemoves[http.CanonicalHeaderKey(name)] = true
			}
		}
		for _, a := range agent.Add {
			name, _, _ := strings.Cut(a, ":")
			if !opRemoves[http.CanonicalHeaderKey(name)] {
				out.Add = append(out.Add, a)
			}
		}
	}
	if op != nil {
		// The operator's values for a name replace the agent's.
		opAdds := map[string]bool{}
		for _, a := range op.Add {
			name, _, _ := strings.Cut(a, ":")
			opAdds[http.CanonicalHeaderKey(name)] = true
		}
		out.Add = slices.DeleteFunc(out.Add, func(a string) bool {
			name, _, _ := strings.Cut(a, ":")
			return opAdds[http.CanonicalHeaderKey(name)]
		})
		out.Add = append(out.Add, op.Add...)
	}
	return &out
}

// unionPrefixes returns a and b, masked, without duplicates, in order.
func unionPrefixes(a, b []netip.Prefix) []netip.Prefix {
	if len(a)+len(b) == 0 {
		return nil
	}
	seen := make(map[netip.Prefix]bool, len(a)+len(b))
	var out []netip.Prefix
	for _, p := range slices.Concat(a, b) {
		p = normPrefix(p)
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// intersectPrefixes returns prefixes covering exactly the addresses in both
// a and b. Two prefixes are nested or disjoint, so every address in both
// lies in a prefix of one list that lies within the other list's union: the
// result is those prefixes, each found in O(log n).
func intersectPrefixes(a, b []netip.Prefix) []netip.Prefix {
	sa, sb := newPrefixSet(a), newPrefixSet(b)
	seen := map[netip.Prefix]bool{}
	var out []netip.Prefix
	for _, l := range []struct {
		ps    []netip.Prefix
		other *prefixSet
	}{{b, sa}, {a, sb}} {
		for _, p := range l.ps {
			p = normPrefix(p)
			if l.other.covers(p) && !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}
