package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"net/netip"
	"reflect"
	"regexp/syntax"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
)

// Rule is one rule of a phase, as ngrok's Traffic Policy writes it: when
// every one of Expressions holds (none: always), its Actions run in order.
// A phase runs its rules in order; an action that answers (deny,
// custom-response, redirect, or a refusal of restrict-ips, rate-limit,
// basic-auth, verify-webhook) ends the phase.
type Rule struct {
	// Name names the rule in errors and logs; optional.
	Name string `json:"name,omitempty"`

	// Expressions are CEL conditions over the phase's variables (see the
	// package documentation), all of which must hold.
	Expressions []string `json:"expressions,omitempty"`

	// Actions are what the rule does, in order.
	Actions []Action `json:"actions"`
}

// Action is one action of a rule: its Type (ActionDeny, ...) and its
// Config, a JSON object whose members each type documents.
type Action struct {
	Type   string          `json:"type"`
	Config json.RawMessage `json:"config,omitempty"`
}

// The actions, by ngrok's names.
const (
	ActionDeny           = "deny"            // {status_code}: refuse (403 by default); on connect, close
	ActionCustomResponse = "custom-response" // {status_code, headers, body}: answer, or replace the app's answer
	ActionRedirect       = "redirect"        // {from, to, status_code, headers}: a 3xx to the URL rewritten
	ActionURLRewrite     = "url-rewrite"     // {from, to}: the request goes on with its path and query rewritten
	ActionAddHeaders     = "add-headers"     // {headers: {name: value}}: values appended
	ActionRemoveHeaders  = "remove-headers"  // {headers: [name]}
	ActionRateLimit      = "rate-limit"      // {name, algorithm, capacity, rate, bucket_key, enforce}
	ActionRestrictIPs    = "restrict-ips"    // {allow, deny, enforce}
	ActionBasicAuth      = "basic-auth"      // {credentials, realm, enforce}
	ActionVerifyWebhook  = "verify-webhook"  // {provider, secret, enforce}
	ActionJWTValidation  = "jwt-validation"  // {issuer, audience, http, jws}: see JWTValidation
	ActionOIDC           = "oidc"            // {issuer_url, client_id, client_secret, scopes, allow_emails, allow_domains} (https)
)

// actionPhases says in which phases each action runs.
var actionPhases = map[string][]string{
	ActionDeny:           {PhaseTCPConnect, PhaseHTTPRequest},
	ActionCustomResponse: {PhaseHTTPRequest, PhaseHTTPResponse},
	ActionRedirect:       {PhaseHTTPRequest},
	ActionURLRewrite:     {PhaseHTTPRequest},
	ActionAddHeaders:     {PhaseHTTPRequest, PhaseHTTPResponse},
	ActionRemoveHeaders:  {PhaseHTTPRequest, PhaseHTTPResponse},
	ActionRateLimit:      {PhaseTCPConnect, PhaseHTTPRequest},
	ActionRestrictIPs:    {PhaseTCPConnect, PhaseHTTPRequest},
	ActionBasicAuth:      {PhaseHTTPRequest},
	ActionVerifyWebhook:  {PhaseHTTPRequest},
	ActionJWTValidation:  {PhaseHTTPRequest},
	ActionOIDC:           {PhaseHTTPRequest},
}

// Actions returns the names of the actions rules may use, sorted.
func Actions() []string {
	var names []string
	for a := range actionPhases {
		names = append(names, a)
	}
	slices.Sort(names)
	return names
}

// The bounds of rules, beside MaxSpecBytes. Crossing one refuses the spec
// with ErrTooLarge, naming the rule.
const (
	// MaxRules bounds the rules of a spec, all phases together (an
	// operator's and an agent's together, once combined).
	MaxRules = 256

	// MaxRuleActions bounds the actions of a rule.
	MaxRuleActions = 16

	// MaxRuleExpressions bounds the expressions of a rule.
	MaxRuleExpressions = 16

	// MaxExpressionBytes bounds one expression, or one "${...}" or bucket
	// key.
	MaxExpressionBytes = 4096

	// MaxRegexBytes bounds a regular expression (redirect's and
	// url-rewrite's from); MaxRegexNodes bounds what it compiles to.
	MaxRegexBytes = 1024
	MaxRegexNodes = 4096

	// MaxBodyBytes bounds custom-response's body.
	MaxBodyBytes = 16 << 10

	// MaxNameBytes bounds a rule's and a rate limit's name.
	MaxNameBytes = 256

	// MaxInterpolations bounds the "${...}" of one action's config.
	MaxInterpolations = 16
)

// The configs of the actions, read strictly from Action.Config.
type (
	denyConfig struct {
		StatusCode int `json:"status_code,omitempty"`
	}
	customResponseConfig struct {
		StatusCode int               `json:"status_code,omitempty"`
		Headers    map[string]string `json:"headers,omitempty"`
		Body       string            `json:"body,omitempty"`
	}
	redirectConfig struct {
		From       string            `json:"from,omitempty"`
		To         string            `json:"to"`
		StatusCode int               `json:"status_code,omitempty"`
		Headers    map[string]string `json:"headers,omitempty"`
	}
	urlRewriteConfig struct {
		From string `json:"from,omitempty"`
		To   string `json:"to"`
	}
	addHeadersConfig struct {
		Headers map[string]string `json:"headers"`
	}
	removeHeadersConfig struct {
		Headers []string `json:"headers"`
	}
	rateLimitConfig struct {
		Name      string   `json:"name,omitempty"`
		Enforce   *bool    `json:"enforce,omitempty"`
		Algorithm string   `json:"algorithm,omitempty"`
		Capacity  int      `json:"capacity"`
		Rate      string   `json:"rate"`
		BucketKey []string `json:"bucket_key,omitempty"`
	}
	restrictIPsConfig struct {
		Enforce *bool          `json:"enforce,omitempty"`
		Allow   []netip.Prefix `json:"allow,omitempty"`
		Deny    []netip.Prefix `json:"deny,omitempty"`
	}
	basicAuthConfig struct {
		Credentials []string `json:"credentials"`
		Realm       string   `json:"realm,omitempty"`
		Enforce     *bool    `json:"enforce,omitempty"`
	}
	oidcActionConfig struct {
		IssuerURL    string   `json:"issuer_url"`
		ClientID     string   `json:"client_id"`
		ClientSecret string   `json:"client_secret,omitempty"`
		Scopes       []string `json:"scopes,omitempty"`
		AllowEmails  []string `json:"allow_emails,omitempty"`
		AllowDomains []string `json:"allow_domains,omitempty"`
	}
	verifyWebhookConfig struct {
		Provider string `json:"provider"`
		Secret   string `json:"secret"`
		Enforce  *bool  `json:"enforce,omitempty"`
	}
)

// actionConfigs makes the config of each action type.
var actionConfigs = map[string]func() any{
	ActionDeny:           func() any { return new(denyConfig) },
	ActionCustomResponse: func() any { return new(customResponseConfig) },
	ActionRedirect:       func() any { return new(redirectConfig) },
	ActionURLRewrite:     func() any { return new(urlRewriteConfig) },
	ActionAddHeaders:     func() any { return new(addHeadersConfig) },
	ActionRemoveHeaders:  func() any { return new(removeHeadersConfig) },
	ActionRateLimit:      func() any { return new(rateLimitConfig) },
	ActionRestrictIPs:    func() any { return new(restrictIPsConfig) },
	ActionBasicAuth:      func() any { return new(basicAuthConfig) },
	ActionVerifyWebhook:  func() any { return new(verifyWebhookConfig) },
	ActionJWTValidation:  func() any { return new(JWTValidation) },
	ActionOIDC:           func() any { return new(oidcActionConfig) },
}

var (
	ruleFields   = jsonFields(reflect.TypeFor[Rule]())
	actionFields = jsonFields(reflect.TypeFor[Action]())
	actionTypes  = func() map[string]bool {
		m := map[string]bool{}
		for a := range actionConfigs {
			m[a] = true
		}
		return m
	}()
)

// ruleAt names a rule in errors: on_http_request[2] "admin".
func ruleAt(phase string, i int, name string) string {
	s := fmt.Sprintf("%s[%d]", phase, i)
	if name != "" {
		s += " " + quote(name)
	}
	return s
}

// parsePhase reads the rules of phase from raw (a JSON array, or null)
// strictly: unknown members, unknown action types and unknown config
// members are ErrInvalid, naming the rule and the action.
func parsePhase(phase string, raw json.RawMessage) ([]Rule, error) {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%w: %s: want a list of rules", ErrInvalid, phase)
	}
	if len(items) > MaxRules {
		return nil, fmt.Errorf("%w: %s: %d rules (at most %d in all)", ErrTooLarge, phase, len(items), MaxRules)
	}
	rules := make([]Rule, 0, len(items))
	for i, item := range items {
		var named struct {
			Name any `json:"name"`
		}
		json.Unmarshal(item, &named)
		name, _ := named.Name.(string)
		at := ruleAt(phase, i, name)
		var r struct {
			Name        string            `json:"name"`
			Expressions []string          `json:"expressions"`
			Actions     []json.RawMessage `json:"actions"`
		}
		if err := decodeStrict(item, at, ruleFields, &r); err != nil {
			return nil, err
		}
		rule := Rule{Name: r.Name, Expressions: r.Expressions}
		if len(r.Actions) > MaxRuleActions {
			return nil, fmt.Errorf("%w: %s: %d actions (at most %d)", ErrTooLarge, at, len(r.Actions), MaxRuleActions)
		}
		for j, a := range r.Actions {
			aat := fmt.Sprintf("%s: actions[%d]", at, j)
			var act Action
			if err := decodeStrict(a, aat, actionFields, &act); err != nil {
				return nil, err
			}
			if _, err := act.config(aat); err != nil {
				return nil, err
			}
			if len(act.Config) > 0 {
				var b bytes.Buffer
				json.Compact(&b, act.Config)
				act.Config = b.Bytes()
			}
			rule.Actions = append(rule.Actions, act)
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// config reads a's config strictly into its type's struct.
func (a *Action) config(at string) (any, error) {
	mk, ok := actionConfigs[a.Type]
	if !ok {
		return nil, fmt.Errorf("%w: %s: unknown action type %s%s", ErrInvalid, at, quote(a.Type), didYouMean(a.Type, actionTypes))
	}
	c := mk()
	raw := a.Config
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	known := jsonFields(reflect.TypeOf(c).Elem())
	if err := decodeStrict(raw, at+" ("+a.Type+") config", known, c); err != nil {
		return nil, err
	}
	// Members of nested objects (jwt-validation's) are checked too.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(mk()); err != nil {
		return nil, fmt.Errorf("%w: %s (%s) config: %v", ErrInvalid, at, a.Type, err)
	}
	return c, nil
}

// Phases returns s's rules by phase, in the order phases run.
func (s *Spec) phases() [3]struct {
	name  string
	rules []Rule
} {
	return [3]struct {
		name  string
		rules []Rule
	}{
		{PhaseTCPConnect, s.OnTCPConnect},
		{PhaseHTTPRequest, s.OnHTTPRequest},
		{PhaseHTTPResponse, s.OnHTTPResponse},
	}
}

// Rules returns the rules of s alone, without its kinds: what an edge
// compiles first to check an agent's rules, so that an error names the
// agent's own rule (in the combined spec, the operator's come first).
func (s *Spec) Rules() Spec {
	return Spec{OnTCPConnect: s.OnTCPConnect, OnHTTPRequest: s.OnHTTPRequest, OnHTTPResponse: s.OnHTTPResponse}
}

// ActionTypes returns the action types s's rules use, each once, sorted.
func (s *Spec) ActionTypes() []string {
	var types []string
	for a := range s.actions() {
		if !slices.Contains(types, a.Type) {
			types = append(types, a.Type)
		}
	}
	slices.Sort(types)
	return types
}

// actions yields every action of s's rules, phase by phase.
func (s *Spec) actions() iter.Seq[*Action] {
	return func(yield func(*Action) bool) {
		for _, ph := range s.phases() {
			for _, r := range ph.rules {
				for i := range r.Actions {
					if !yield(&r.Actions[i]) {
						return
					}
				}
			}
		}
	}
}

// configsOf yields the configs of s's actions of type typ that read.
func configsOf[T any](s *Spec, typ string) iter.Seq[T] {
	return func(yield func(T) bool) {
		for a := range s.actions() {
			if a.Type != typ {
				continue
			}
			if c, err := a.config(""); err == nil && !yield(c.(T)) {
				return
			}
		}
	}
}

// validateRules checks the rules of s for proto: phases that fit, actions
// in their phases, well-formed configs, the bounds.
func (s *Spec) validateRules(proto string) error {
	total := 0
	for _, ph := range s.phases() {
		if len(ph.rules) == 0 {
			continue
		}
		if !Fits(ph.name, proto) {
			return fmt.Errorf("%w: %s is not for %s endpoints (only %s)", ErrProtocol, ph.name, proto, kindProtos[ph.name])
		}
		total += len(ph.rules)
		if total > MaxRules {
			return fmt.Errorf("%w: %d rules or more (at most %d in all)", ErrTooLarge, total, MaxRules)
		}
		for i, r := range ph.rules {
			at := ruleAt(ph.name, i, r.Name)
			if err := r.validate(ph.name, at, proto); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Rule) validate(phase, at, proto string) error {
	switch {
	case len(r.Name) > MaxNameBytes:
		return fmt.Errorf("%w: %s: a name of %d bytes (at most %d)", ErrTooLarge, at, len(r.Name), MaxNameBytes)
	case hasCTL(r.Name) || !utf8.ValidString(r.Name):
		return fmt.Errorf("%w: %s: a name with control characters", ErrInvalid, at)
	case len(r.Expressions) > MaxRuleExpressions:
		return fmt.Errorf("%w: %s: %d expressions (at most %d)", ErrTooLarge, at, len(r.Expressions), MaxRuleExpressions)
	case len(r.Actions) == 0:
		return fmt.Errorf("%w: %s: no actions", ErrInvalid, at)
	case len(r.Actions) > MaxRuleActions:
		return fmt.Errorf("%w: %s: %d actions (at most %d)", ErrTooLarge, at, len(r.Actions), MaxRuleActions)
	}
	for k, e := range r.Expressions {
		if err := checkExpr(fmt.Sprintf("%s: expressions[%d]", at, k), e); err != nil {
			return err
		}
	}
	for j := range r.Actions {
		a := &r.Actions[j]
		aat := fmt.Sprintf("%s: actions[%d]", at, j)
		if !slices.Contains(actionPhases[a.Type], phase) && actionConfigs[a.Type] != nil {
			return fmt.Errorf("%w: %s: %s does not run in %s (only %s)", ErrProtocol, aat, a.Type, phase, strings.Join(actionPhases[a.Type], ", "))
		}
		c, err := a.config(aat)
		if err != nil {
			return err
		}
		if err := validateAction(aat+" ("+a.Type+")", phase, proto, c); err != nil {
			return err
		}
	}
	return nil
}

func checkExpr(at, e string) error {
	switch {
	case len(e) > MaxExpressionBytes:
		return fmt.Errorf("%w: %s: %d bytes (at most %d)", ErrTooLarge, at, len(e), MaxExpressionBytes)
	case strings.TrimSpace(e) == "":
		return fmt.Errorf("%w: %s: empty", ErrInvalid, at)
	case !utf8.ValidString(e):
		return fmt.Errorf("%w: %s: not UTF-8", ErrInvalid, at)
	}
	return nil
}

// validateAction checks the values of a decoded config.
func validateAction(at, phase, proto string, c any) error {
	switch c := c.(type) {
	case *denyConfig:
		if c.StatusCode != 0 && (c.StatusCode < 400 || c.StatusCode > 599) {
			return fmt.Errorf("%w: %s: status_code %d: want 400 to 599", ErrInvalid, at, c.StatusCode)
		}
		if phase == PhaseTCPConnect && c.StatusCode != 0 {
			return fmt.Errorf("%w: %s: status_code on a connection (it is closed)", ErrInvalid, at)
		}
	case *customResponseConfig:
		if c.StatusCode != 0 && (c.StatusCode < 200 || c.StatusCode > 599) {
			return fmt.Errorf("%w: %s: status_code %d: want 200 to 599", ErrInvalid, at, c.StatusCode)
		}
		if len(c.Body) > MaxBodyBytes {
			return fmt.Errorf("%w: %s: a body of %d bytes (at most %d)", ErrTooLarge, at, len(c.Body), MaxBodyBytes)
		}
		if err := validHeaderMap(at, c.Headers, false); err != nil {
			return err
		}
		return checkInterpolations(at, append(mapValues(c.Headers), c.Body)...)
	case *redirectConfig:
		switch c.StatusCode {
		case 0, 301, 302, 303, 307, 308:
		default:
			return fmt.Errorf("%w: %s: status_code %d: want 301, 302, 303, 307 or 308", ErrInvalid, at, c.StatusCode)
		}
		if c.To == "" {
			return fmt.Errorf("%w: %s: no to", ErrInvalid, at)
		}
		if err := checkRegex(at+": from", c.From); err != nil {
			return err
		}
		if err := validHeaderMap(at, c.Headers, false); err != nil {
			return err
		}
		return checkInterpolations(at, append(mapValues(c.Headers), c.To)...)
	case *urlRewriteConfig:
		if c.To == "" {
			return fmt.Errorf("%w: %s: no to", ErrInvalid, at)
		}
		if err := checkRegex(at+": from", c.From); err != nil {
			return err
		}
		return checkInterpolations(at, c.To)
	case *addHeadersConfig:
		if len(c.Headers) == 0 {
			return fmt.Errorf("%w: %s: no headers", ErrInvalid, at)
		}
		if err := validHeaderMap(at, c.Headers, phase == PhaseHTTPRequest); err != nil {
			return err
		}
		return checkInterpolations(at, mapValues(c.Headers)...)
	case *removeHeadersConfig:
		if len(c.Headers) == 0 {
			return fmt.Errorf("%w: %s: no headers", ErrInvalid, at)
		}
		if len(c.Headers) > MaxHeaderOps {
			return fmt.Errorf("%w: %s: %d headers (at most %d)", ErrTooLarge, at, len(c.Headers), MaxHeaderOps)
		}
		reserved, kind := reservedRequest, KindRequestHeaders
		if phase == PhaseHTTPResponse {
			reserved, kind = reservedResponse, KindResponseHeaders
		}
		for _, name := range c.Headers {
			if err := allowedHeader(kind, name, reserved); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		}
	case *rateLimitConfig:
		switch c.Algorithm {
		case "", "sliding_window", "token_bucket":
		default:
			return fmt.Errorf("%w: %s: algorithm %s: want sliding_window or token_bucket", ErrInvalid, at, quote(c.Algorithm))
		}
		if len(c.Name) > MaxNameBytes {
			return fmt.Errorf("%w: %s: a name of %d bytes (at most %d)", ErrTooLarge, at, len(c.Name), MaxNameBytes)
		}
		if c.Capacity < 1 || c.Capacity > MaxRateRequests {
			return fmt.Errorf("%w: %s: capacity %d: want 1 to %d", ErrInvalid, at, c.Capacity, MaxRateRequests)
		}
		if _, err := c.period(); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, at, err)
		}
		if len(c.BucketKey) > MaxRuleExpressions {
			return fmt.Errorf("%w: %s: %d bucket keys (at most %d)", ErrTooLarge, at, len(c.BucketKey), MaxRuleExpressions)
		}
		for k, e := range c.BucketKey {
			if err := checkExpr(fmt.Sprintf("%s: bucket_key[%d]", at, k), e); err != nil {
				return err
			}
		}
	case *restrictIPsConfig:
		if len(c.Allow) == 0 && len(c.Deny) == 0 {
			return fmt.Errorf("%w: %s: neither allow nor deny", ErrInvalid, at)
		}
		if err := validCIDRs(at+": allow", c.Allow); err != nil {
			return err
		}
		return validCIDRs(at+": deny", c.Deny)
	case *basicAuthConfig:
		b := BasicAuth{Credentials: c.Credentials}
		if err := b.validate(); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		if len(c.Realm) > MaxNameBytes || hasCTL(c.Realm) || strings.ContainsAny(c.Realm, `"\`) {
			return fmt.Errorf("%w: %s: realm: at most %d bytes, no quotes, backslashes or control characters", ErrInvalid, at, MaxNameBytes)
		}
	case *verifyWebhookConfig:
		w := Webhook{Provider: c.Provider, Secret: c.Secret}
		if err := w.validate(); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
	case *JWTValidation:
		return c.validate(at)
	case *oidcActionConfig:
		if proto != ProtoHTTPS {
			return fmt.Errorf("%w: %s: an oidc login is for https endpoints (its cookies are Secure)", ErrProtocol, at)
		}
		for _, sc := range c.Scopes {
			if sc != "openid" && sc != "email" && sc != "profile" {
				return fmt.Errorf("%w: %s: scope %s: the login asks for openid and email (profile is taken too)", ErrInvalid, at, quote(sc))
			}
		}
		if err := c.oidc().validateLogin(len(c.AllowEmails)+len(c.AllowDomains) == 0); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
	}
	return nil
}

// oidc is the login an oidc action runs, as the kind declares one.
func (c *oidcActionConfig) oidc() *OIDC {
	return &OIDC{Issuer: c.IssuerURL, ClientID: c.ClientID, ClientSecret: c.ClientSecret, AllowEmails: c.AllowEmails, AllowDomains: c.AllowDomains}
}

// period is the rate limit's period: a duration of whole seconds, 1s to
// 24h.
func (c *rateLimitConfig) period() (time.Duration, error) {
	d, err := time.ParseDuration(c.Rate)
	switch {
	case err != nil:
		return 0, fmt.Errorf("rate %s: want a duration such as 60s", quote(c.Rate))
	case d < time.Second || d > 24*time.Hour || d%time.Second != 0:
		return 0, fmt.Errorf("rate %s: want whole seconds from 1s to 24h", quote(c.Rate))
	}
	return d, nil
}

// mapValues returns m's values in the order of their keys.
func mapValues(m map[string]string) []string {
	var v []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v = append(v, m[k])
	}
	return v
}

// validHeaderMap checks names and the literal parts of values.
func validHeaderMap(at string, m map[string]string, request bool) error {
	if len(m) > MaxHeaderOps {
		return fmt.Errorf("%w: %s: %d headers (at most %d)", ErrTooLarge, at, len(m), MaxHeaderOps)
	}
	kind, reserved := KindResponseHeaders, reservedResponse
	if request {
		kind, reserved = KindRequestHeaders, reservedRequest
	}
	size := 0
	for name, value := range m {
		size += len(name) + len(value)
		if err := allowedHeader(kind, name, reserved); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		parts, _ := splitInterpolations(value)
		for _, p := range parts {
			if !p.expr && !httpguts.ValidHeaderFieldValue(p.text) {
				return fmt.Errorf("%w: %s: header %s: invalid value", ErrInvalid, at, quote(name))
			}
		}
	}
	if size > MaxHeaderBytes {
		return fmt.Errorf("%w: %s: %d bytes of headers (at most %d)", ErrTooLarge, at, size, MaxHeaderBytes)
	}
	return nil
}

// checkRegex checks a regular expression's size and syntax (RE2).
func checkRegex(at, re string) error {
	if re == "" {
		return nil
	}
	if len(re) > MaxRegexBytes {
		return fmt.Errorf("%w: %s: %d bytes (at most %d)", ErrTooLarge, at, len(re), MaxRegexBytes)
	}
	parsed, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, at, err)
	}
	prog, err := syntax.Compile(parsed.Simplify())
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, at, err)
	}
	if len(prog.Inst) > MaxRegexNodes {
		return fmt.Errorf("%w: %s: compiles to %d instructions (at most %d)", ErrTooLarge, at, len(prog.Inst), MaxRegexNodes)
	}
	return nil
}

// checkInterpolations checks the "${...}" of values: well formed, bounded.
func checkInterpolations(at string, values ...string) error {
	n := 0
	for _, v := range values {
		parts, err := splitInterpolations(v)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, at, err)
		}
		for _, p := range parts {
			if p.expr {
				n++
				if err := checkExpr(at+": ${...}", p.text); err != nil {
					return err
				}
			}
		}
	}
	if n > MaxInterpolations {
		return fmt.Errorf("%w: %s: %d interpolations (at most %d)", ErrTooLarge, at, n, MaxInterpolations)
	}
	return nil
}

// part is a piece of an interpolated string: text, or an expression.
type part struct {
	text string
	expr bool
}

// splitInterpolations splits s into text and the expressions of its
// "${...}". An expression ends at the "}" that balances its "{", outside
// string literals ('...' or "...", with backslash escapes), so that
// "${ {'a': 1}['a'] }" is one expression. "$" not followed by "{" is text.
func splitInterpolations(s string) ([]part, error) {
	var parts []part
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			if s != "" {
				parts = append(parts, part{text: s})
			}
			return parts, nil
		}
		if i > 0 {
			parts = append(parts, part{text: s[:i]})
		}
		rest := s[i+2:]
		end, depth := -1, 0
		var quoteCh byte
	scan:
		for j := 0; j < len(rest); j++ {
			c := rest[j]
			switch {
			case quoteCh != 0 && c == '\\':
				j++
			case quoteCh != 0:
				if c == quoteCh {
					quoteCh = 0
				}
			case c == '\'' || c == '"':
				quoteCh = c
			case c == '{':
				depth++
			case c == '}' && depth == 0:
				end = j
				break scan
			case c == '}':
				depth--
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("a ${ without its }")
		}
		expr := rest[:end]
		if strings.TrimSpace(expr) == "" {
			return nil, fmt.Errorf("an empty ${}")
		}
		parts = append(parts, part{text: expr, expr: true})
		s = rest[end+1:]
	}
}

// validStatusText is used by custom responses without a body.
func validStatusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return fmt.Sprintf("status %d", code)
}
