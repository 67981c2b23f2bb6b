package policy

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// A compiled policy is three lists of steps, one per phase: first the
// steps the kinds compile to (in the order the package documentation
// gives), then the rules. Every check runs through runPhase: one order.

// step is a compiled rule: its conditions and its actions.
type step struct {
	at    string // names the rule: on_http_request[2] "admin", or a kind
	conds []BoolProgram
	acts  []act
}

// act is a compiled action.
type act interface {
	run(x *run) (answered bool, err error)
}

// run is the state of one phase on one connection, request or response.
type run struct {
	p    *Policy
	vars Vars
	w    http.ResponseWriter // on_http_request
	r    *http.Request       // http phases: the client's request
	resp *http.Response      // on_http_response
	ref  Refusal             // on_tcp_connect: why the connection is closed
}

// runs recycles runs: a run escapes (actions are interfaces), and a
// request should cost the policy no allocation.
var runs = sync.Pool{New: func() any { return new(run) }}

func getRun() *run { return runs.Get().(*run) }

// putRun clears x, so that it keeps no request alive, and recycles it.
func putRun(x *run) {
	*x = run{}
	runs.Put(x)
}

// errRuleFailed wraps a rule's failure to evaluate.
var errRuleFailed = errors.New("a rule could not be evaluated")

// runPhase runs steps in order, until an action answers (true). An
// expression or action that fails to evaluate ends the phase with an error
// naming the rule: the caller fails closed.
func runPhase(steps []step, x *run) (bool, error) {
	for i := range steps {
		s := &steps[i]
		ok := true
		for _, c := range s.conds {
			holds, err := c(&x.vars)
			if err != nil {
				return false, fmt.Errorf("%w: %s: %v", errRuleFailed, s.at, err)
			}
			if !holds {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		for _, a := range s.acts {
			answered, err := a.run(x)
			if err != nil {
				return false, fmt.Errorf("%w: %s: %v", errRuleFailed, s.at, err)
			}
			if answered {
				return true, nil
			}
		}
	}
	return false, nil
}

// refusedRule is the answer of a rule that could not be evaluated.
var refusedRule = Refusal{http.StatusInternalServerError, CodePolicyError, "the traffic policy of this endpoint could not be evaluated"}

// failed logs a rule's failure, at most once a second per policy (clients
// choose how often it happens), with how many were not logged.
func (p *Policy) failed(err error, attrs ...any) {
	now := p.clock().UnixNano()
	last := p.lastFailLog.Load()
	if now-last < int64(time.Second) || !p.lastFailLog.CompareAndSwap(last, now) {
		p.failsUnlogged.Add(1)
		return
	}
	attrs = append(attrs, "err", err, "not_logged_before", p.failsUnlogged.Swap(0))
	p.log.Warn("policy: a rule failed; answered "+CodePolicyError, attrs...)
}

// interp is a compiled interpolated string.
type interp struct {
	parts []part
	progs []StringProgram // one per expression part, in order
}

// eval returns the string; escape, when set, is applied to each value an
// expression yields.
func (in *interp) eval(v *Vars, escape func(string) string) (string, error) {
	if len(in.progs) == 0 && len(in.parts) == 1 {
		return in.parts[0].text, nil
	}
	var b strings.Builder
	k := 0
	for _, p := range in.parts {
		if !p.expr {
			b.WriteString(p.text)
			continue
		}
		s, err := in.progs[k](v)
		k++
		if err != nil {
			return "", err
		}
		if escape != nil {
			s = escape(s)
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

// compiler compiles a spec's rules for one policy.
type compiler struct {
	ctx     context.Context // of Compile: an oidc action's discovery
	login   *oidcLogin      // an oidc action's, once compiled
	engine  Engine
	opts    *Options
	phase   string
	at      string
	clients int
}

func (c *compiler) interp(s string) (*interp, error) {
	parts, err := splitInterpolations(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, c.at, err)
	}
	in := &interp{parts: parts}
	if len(parts) == 0 {
		in.parts = []part{{text: ""}}
	}
	for _, p := range parts {
		if !p.expr {
			continue
		}
		prog, err := c.stringProg(p.text, "${"+p.text+"}")
		if err != nil {
			return nil, err
		}
		in.progs = append(in.progs, prog)
	}
	return in, nil
}

func (c *compiler) noEngine() error {
	return fmt.Errorf("%w: %s: this edge has no rules engine for expressions (see Options.Engine)", ErrUnsupported, c.at)
}

func (c *compiler) stringProg(expr, what string) (StringProgram, error) {
	if c.engine == nil {
		return nil, c.noEngine()
	}
	prog, err := c.engine.String(c.phase, expr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s: %v", ErrInvalid, c.at, what, err)
	}
	return prog, nil
}

// rule compiles r, of c.phase.
func (c *compiler) rule(r *Rule, i int) (step, error) {
	st := step{at: ruleAt(c.phase, i, r.Name)}
	c.at = st.at
	if len(r.Expressions) > 0 && c.engine == nil {
		return st, c.noEngine()
	}
	if all, ok := c.engine.(interface {
		All(phase string, exprs []string) (BoolProgram, error)
	}); ok && len(r.Expressions) > 1 {
		// One program for them all: one evaluation per request. Its
		// errors name the expression ("expressions[1]: ...").
		prog, err := all.All(c.phase, r.Expressions)
		if err != nil {
			return st, fmt.Errorf("%w: %s: %v", ErrInvalid, st.at, err)
		}
		st.conds = []BoolProgram{prog}
	} else {
		for k, e := range r.Expressions {
			prog, err := c.engine.Bool(c.phase, e)
			if err != nil {
				return st, fmt.Errorf("%w: %s: expressions[%d]: %v", ErrInvalid, st.at, k, err)
			}
			st.conds = append(st.conds, prog)
		}
	}
	for j := range r.Actions {
		a := &r.Actions[j]
		c.at = fmt.Sprintf("%s: actions[%d] (%s)", st.at, j, a.Type)
		cfg, err := a.config(c.at)
		if err != nil {
			return st, err
		}
		ac, err := c.action(cfg)
		if err != nil {
			return st, err
		}
		st.acts = append(st.acts, ac)
	}
	return st, nil
}

func enforced(b *bool) bool { return b == nil || *b }

// action compiles one decoded, validated config.
func (c *compiler) action(cfg any) (act, error) {
	switch cfg := cfg.(type) {
	case *denyConfig:
		status := cfg.StatusCode
		if status == 0 {
			status = http.StatusForbidden
		}
		return &denyAct{ref: Refusal{status, CodePolicyDenied, "the traffic policy of this endpoint denies this request"}}, nil
	case *customResponseConfig:
		a := &customAct{status: cfg.StatusCode}
		if a.status == 0 {
			a.status = http.StatusOK
		}
		var err error
		if a.headers, err = c.headers(cfg.Headers); err != nil {
			return nil, err
		}
		if a.body, err = c.interp(cfg.Body); err != nil {
			return nil, err
		}
		return a, nil
	case *redirectConfig:
		a := &redirectAct{status: cfg.StatusCode}
		if a.status == 0 {
			a.status = http.StatusFound
		}
		var err error
		if a.from, err = compileFrom(cfg.From); err != nil {
			return nil, fmt.Errorf("%w: %s: from: %v", ErrInvalid, c.at, err)
		}
		if a.to, err = c.interp(cfg.To); err != nil {
			return nil, err
		}
		if a.headers, err = c.headers(cfg.Headers); err != nil {
			return nil, err
		}
		return a, nil
	case *urlRewriteConfig:
		a := &rewriteAct{}
		var err error
		if a.from, err = compileFrom(cfg.From); err != nil {
			return nil, fmt.Errorf("%w: %s: from: %v", ErrInvalid, c.at, err)
		}
		if a.to, err = c.interp(cfg.To); err != nil {
			return nil, err
		}
		return a, nil
	case *addHeadersConfig:
		hs, err := c.headers(cfg.Headers)
		if err != nil {
			return nil, err
		}
		return &addHeadersAct{headers: hs}, nil
	case *removeHeadersConfig:
		a := &removeHeadersAct{}
		for _, n := range cfg.Headers {
			a.names = append(a.names, http.CanonicalHeaderKey(n))
		}
		return a, nil
	case *rateLimitConfig:
		period, _ := cfg.period()
		t := newRateTable(&RateLimit{Requests: cfg.Capacity, Seconds: int(period / time.Second)}, c.clients)
		a := &rateAct{table: t, enforce: enforced(cfg.Enforce), seed: maphash.MakeSeed(), seed2: maphash.MakeSeed()}
		for k, e := range cfg.BucketKey {
			prog, err := c.stringProg(e, fmt.Sprintf("bucket_key[%d]", k))
			if err != nil {
				return nil, err
			}
			a.keys = append(a.keys, prog)
		}
		return a, nil
	case *restrictIPsConfig:
		a := &restrictAct{enforce: enforced(cfg.Enforce)}
		if len(cfg.Allow) > 0 {
			a.allow = newPrefixSet(cfg.Allow)
		}
		if len(cfg.Deny) > 0 {
			a.deny = newPrefixSet(cfg.Deny)
		}
		return a, nil
	case *basicAuthConfig:
		realm := cfg.Realm
		if realm == "" {
			realm = "tunnelkit"
		}
		return &basicAct{
			auth:      newBasicAuth(&BasicAuth{Credentials: cfg.Credentials}),
			challenge: []string{`Basic realm="` + realm + `", charset="UTF-8"`},
			enforce:   enforced(cfg.Enforce),
		}, nil
	case *verifyWebhookConfig:
		return &webhookAct{wh: newWebhook(&Webhook{Provider: cfg.Provider, Secret: cfg.Secret}), enforce: enforced(cfg.Enforce)}, nil
	case *oidcActionConfig:
		if c.login != nil {
			return nil, fmt.Errorf("%w: %s: one oidc login per endpoint (its callback is the host's)", ErrProtocol, c.at)
		}
		l, err := newOIDCLogin(c.ctx, cfg.oidc(), c.opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.at, err)
		}
		c.login = l
		return &oidcAct{l}, nil
	case *JWTValidation:
		je, ok := c.engine.(JWTEngine)
		if !ok {
			return nil, fmt.Errorf("%w: %s: this edge has no engine that validates tokens (see Options.Engine)", ErrUnsupported, c.at)
		}
		verify, err := je.JWT(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.at, err)
		}
		a := &jwtAct{verify: verify}
		for _, t := range cfg.HTTP.Tokens {
			if t.Method == "" {
				t.Method = "header"
			}
			if t.Method == "header" && t.Name == "" {
				t.Name, t.Prefix = "Authorization", "Bearer "
			}
			a.tokens = append(a.tokens, t)
		}
		if len(a.tokens) == 0 {
			a.tokens = []JWTToken{{Method: "header", Name: "Authorization", Prefix: "Bearer "}}
		}
		return a, nil
	}
	return nil, fmt.Errorf("%w: %s: not an action", ErrInvalid, c.at)
}

// header is a compiled header to add.
type header struct {
	name  string
	value *interp
}

func (c *compiler) headers(m map[string]string) ([]header, error) {
	var hs []header
	for _, name := range slices.Sorted(maps.Keys(m)) {
		in, err := c.interp(m[name])
		if err != nil {
			return nil, err
		}
		hs = append(hs, header{http.CanonicalHeaderKey(name), in})
	}
	return hs, nil
}

// compileFrom compiles a from regex; "" is nil (the whole URL).
func compileFrom(from string) (*regexp.Regexp, error) {
	if from == "" {
		return nil, nil
	}
	return regexp.Compile(from)
}

// setHeaders adds the headers' values to h, each checked (an interpolated
// value may hold what a header may not).
func setHeaders(h http.Header, hs []header, v *Vars) error {
	for _, hd := range hs {
		val, err := hd.value.eval(v, nil)
		if err != nil {
			return err
		}
		if !httpguts.ValidHeaderFieldValue(val) {
			return fmt.Errorf("header %s: the value is not one a header may have", hd.name)
		}
		h[hd.name] = append(h[hd.name], val)
	}
	return nil
}

// denyAct refuses: a request with its status, a connection by closing it.
type denyAct struct{ ref Refusal }

func (a *denyAct) run(x *run) (bool, error) {
	x.refuse(a.ref)
	return true, nil
}

// refuse answers the request with ref, or marks the connection refused.
func (x *run) refuse(ref Refusal) {
	if x.w != nil {
		x.p.refuse(x.w, x.r, ref)
		return
	}
	x.ref = ref
}

// customAct answers the request, or replaces the app's answer.
type customAct struct {
	status  int
	headers []header
	body    *interp
}

func (a *customAct) run(x *run) (bool, error) {
	body, err := a.body.eval(&x.vars, nil)
	if err != nil {
		return false, err
	}
	h := http.Header{}
	if err := setHeaders(h, a.headers, &x.vars); err != nil {
		return false, err
	}
	if x.resp != nil {
		resp := x.resp
		if resp.Body != nil {
			resp.Body.Close()
		}
		resp.StatusCode = a.status
		resp.Status = strconv.Itoa(a.status) + " " + validStatusText(a.status)
		resp.Header = h
		resp.Trailer = nil
		resp.TransferEncoding = nil
		resp.ContentLength = int64(len(body))
		resp.Body = io.NopCloser(strings.NewReader(body))
		h.Set("Content-Length", strconv.Itoa(len(body)))
		return true, nil
	}
	dst := x.w.Header()
	for name, vs := range h {
		dst[name] = vs
	}
	if x.r.ContentLength != 0 && x.r.ProtoMajor == 1 {
		dst.Set("Connection", "close") // rather than read an unread body
	}
	x.w.WriteHeader(a.status)
	if x.r.Method != http.MethodHead {
		io.WriteString(x.w, body)
	}
	return true, nil
}

// RequestURL is the URL the client asked for, as rules see it (req.url,
// redirect's and url-rewrite's from): scheme, Host, path and query.
func RequestURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + r.URL.RequestURI()
}

// rewriteURL applies from and to to the request's URL: the first match of
// from replaced by to, whose $1, $name are from's groups (the values of
// its ${...} are taken as they are); with no from, to is the URL.
// It reports false when from does not match.
func rewriteURL(from *regexp.Regexp, to *interp, v *Vars, u string) (string, bool, error) {
	if from == nil {
		s, err := to.eval(v, nil)
		return s, true, err
	}
	m := from.FindStringSubmatchIndex(u)
	if m == nil {
		return "", false, nil
	}
	tmpl, err := to.eval(v, func(s string) string { return strings.ReplaceAll(s, "$", "$$") })
	if err != nil {
		return "", false, err
	}
	out := from.ExpandString(nil, tmpl, u, m)
	return u[:m[0]] + string(out) + u[m[1]:], true, nil
}

// redirectAct answers with a redirect to the URL rewritten.
type redirectAct struct {
	from    *regexp.Regexp
	to      *interp
	status  int
	headers []header
}

func (a *redirectAct) run(x *run) (bool, error) {
	u := RequestURL(x.r)
	loc, ok, err := rewriteURL(a.from, a.to, &x.vars, u)
	if err != nil || !ok || loc == u {
		return false, err
	}
	if !httpguts.ValidHeaderFieldValue(loc) {
		return false, fmt.Errorf("the redirect's URL is not one a header may hold")
	}
	h := x.w.Header()
	if err := setHeaders(h, a.headers, &x.vars); err != nil {
		return false, err
	}
	h.Set("Location", loc)
	if x.r.ContentLength != 0 && x.r.ProtoMajor == 1 {
		h.Set("Connection", "close")
	}
	x.w.WriteHeader(a.status)
	return true, nil
}

// rewriteAct rewrites the request's path and query.
type rewriteAct struct {
	from *regexp.Regexp
	to   *interp
}

func (a *rewriteAct) run(x *run) (bool, error) {
	u := RequestURL(x.r)
	out, ok, err := rewriteURL(a.from, a.to, &x.vars, u)
	if err != nil || !ok || out == u {
		return false, err
	}
	nu, err := url.Parse(out)
	if err != nil {
		return false, fmt.Errorf("the rewritten URL: %v", err)
	}
	if nu.Host != "" && !strings.EqualFold(nu.Host, x.r.Host) {
		return false, fmt.Errorf("the rewritten URL names another host (a url-rewrite changes the path and query only)")
	}
	path := nu.EscapedPath()
	if path == "" {
		path = "/"
	}
	if !strings.HasPrefix(path, "/") {
		return false, fmt.Errorf("the rewritten path does not start with /")
	}
	x.r.URL.Path, x.r.URL.RawPath = nu.Path, nu.RawPath
	if x.r.URL.Path == "" {
		x.r.URL.Path = "/"
	}
	x.r.URL.RawQuery = nu.RawQuery
	x.r.RequestURI = x.r.URL.RequestURI()
	return false, nil
}

// addHeadersAct appends values to the request's or the response's header.
type addHeadersAct struct{ headers []header }

func (a *addHeadersAct) run(x *run) (bool, error) {
	h := x.r.Header
	if x.resp != nil {
		h = x.resp.Header
	}
	return false, setHeaders(h, a.headers, &x.vars)
}

// removeHeadersAct removes headers of the request or the response.
type removeHeadersAct struct{ names []string }

func (a *removeHeadersAct) run(x *run) (bool, error) {
	h := x.r.Header
	if x.resp != nil {
		h = x.resp.Header
	}
	for _, n := range a.names {
		delete(h, n)
	}
	return false, nil
}

// restrictAct lets through only the addresses its lists allow.
type restrictAct struct {
	allow, deny *prefixSet
	enforce     bool
}

// allows reports whether the lists let c in; an invalid address is
// refused by any list.
func (a *restrictAct) allows(c netip.Addr) bool {
	return (a.allow == nil || a.allow.contains(c)) && (a.deny == nil || (c.IsValid() && !a.deny.contains(c)))
}

func (a *restrictAct) run(x *run) (bool, error) {
	if a.allows(x.vars.Conn.Client.Addr()) || !a.enforce {
		return false, nil
	}
	x.refuse(refusedAddr)
	return true, nil
}

// rateAct spends a token of the bucket of the request's key: the client's
// source (an IPv4 address, an IPv6 /64), or the values of its bucket_key.
type rateAct struct {
	table       *rateTable
	keys        []StringProgram
	enforce     bool
	seed, seed2 maphash.Seed
}

func (a *rateAct) run(x *run) (bool, error) {
	now := x.p.nanos()
	var ok bool
	var wait time.Duration
	if len(a.keys) == 0 {
		ok, wait = a.table.allow(x.vars.Conn.Client.Addr(), now)
	} else {
		var h1, h2 maphash.Hash
		h1.SetSeed(a.seed)
		h2.SetSeed(a.seed2)
		for _, k := range a.keys {
			s, err := k(&x.vars)
			if err != nil {
				return false, err
			}
			var n [8]byte
			l := strconv.AppendInt(n[:0], int64(len(s)), 10)
			for _, h := range []*maphash.Hash{&h1, &h2} {
				h.Write(l)
				h.WriteByte(':')
				h.WriteString(s)
			}
		}
		ok, wait = a.table.allowKey(rateKey{hi: h1.Sum64(), lo: h2.Sum64() | 1<<63}, now)
	}
	if ok || !a.enforce {
		return false, nil
	}
	if x.w != nil {
		secs := max(int64((wait+time.Second-1)/time.Second), 1)
		x.w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	x.refuse(refusedRate)
	return true, nil
}

// basicAct asks for a user and password.
type basicAct struct {
	auth      *basicAuth
	challenge []string
	enforce   bool
}

func (a *basicAct) run(x *run) (bool, error) {
	i := a.auth.check(x.r.Header)
	if i < 0 {
		if !a.enforce {
			return false, nil
		}
		x.w.Header()["Www-Authenticate"] = a.challenge
		x.refuse(refusedLogin)
		return true, nil
	}
	if !a.auth.pass {
		delete(x.r.Header, "Authorization")
	}
	x.r.Header[HeaderAuthUser] = a.auth.users[i]
	x.vars.Auth.User = a.auth.users[i][0]
	return false, nil
}

var refusedLogin = Refusal{http.StatusUnauthorized, CodeUnauthorized, "this endpoint needs a user and password"}

// webhookAct accepts only bodies signed by a webhook provider.
type webhookAct struct {
	wh      *webhook
	enforce bool
}

func (a *webhookAct) run(x *run) (bool, error) {
	body, ok := x.p.readBody(x.w, x.r)
	if !ok {
		return true, nil
	}
	if a.wh.verify(x.r.Header, body, x.p.clock()) || !a.enforce {
		return false, nil
	}
	x.refuse(Refusal{http.StatusForbidden, CodeWebhookInvalid, "no valid " + a.wh.provider + " webhook signature"})
	return true, nil
}

// mtlsAct is the mutual_tls kind.
type mtlsAct struct{ m *mutualTLS }

func (a *mtlsAct) run(x *run) (bool, error) {
	subject, ok := a.m.verify(x.r.TLS)
	if !ok {
		x.refuse(Refusal{http.StatusForbidden, CodePolicyDenied, "this endpoint needs a client certificate from its CAs"})
		return true, nil
	}
	x.r.Header[HeaderClientCertSubject] = []string{subject}
	x.vars.Conn.ClientCertSubject = subject
	return false, nil
}

// oidcAct is the oidc kind.
type oidcAct struct{ l *oidcLogin }

func (a *oidcAct) run(x *run) (bool, error) {
	if a.l.serve(x.p, x.w, x.r) {
		return true, nil
	}
	x.vars.Auth.Email = x.r.Header.Get(HeaderAuthEmail)
	x.vars.Auth.Subject = x.r.Header.Get(HeaderAuthSubject)
	return false, nil
}

// headerOpsAct is the request_headers or response_headers kind.
type headerOpsAct struct{ ops *headerOps }

func (a *headerOpsAct) run(x *run) (bool, error) {
	if x.resp != nil {
		a.ops.apply(x.resp.Header)
	} else {
		a.ops.apply(x.r.Header)
	}
	return false, nil
}
