// Package rules is the expression engine of traffic policy rules: it
// compiles their CEL expressions (github.com/google/cel-go) for package
// policy, with ngrok's variable names, and bounds what they may cost. It is
// a module of its own, so that an app that imports package agent, or an
// edge embedded without rules, builds none of CEL.
//
// Give an edge one:
//
//	srv := &edge.Server{..., PolicyEngine: rules.Engine{}}
//
// or policy.Compile directly: policy.Options{Engine: rules.Engine{}}.
//
// # Variables
//
// Each phase declares what it can know; an expression naming anything else
// is refused when the bind compiles it.
//
//	conn.client_ip             string   the client's address (every phase)
//	conn.client_port           int
//	conn.server_port           int      the edge's port the client reached (0 when unknown)
//	conn.tls.server_name       string   the TLS server name (SNI); "" without TLS
//	conn.tls.client_cert.subject string the subject mutual_tls verified (RFC 2253); ""
//	endpoint.url               string   e.g. "https://app.example.com/api"
//	endpoint.host              string
//	endpoint.protocol          string   http, https, tls or tcp
//	time.now                   timestamp when the phase started
//	req.method                 string   (http phases)
//	req.url                    string   the URL the client asked for: scheme://host/path?query
//	req.url.raw                string   the same
//	req.url.scheme             string   http or https
//	req.url.host               string   the Host, without its port
//	req.url.path               string   the path, decoded
//	req.url.query              string   the query, raw, without its "?"
//	req.url.query_params       map(string, list(string))
//	req.host                   string   the Host header as sent (with a port, if any)
//	req.headers                map(string, list(string))  names in lower case
//	req.cookies                map(string, list(string))
//	req.content_length         int      -1 when unknown
//	req.user_agent             string
//	auth.user                  string   basic auth's user, once a login ran
//	auth.email, auth.subject   string   an oidc login's
//	actions.jwt.claims         map(string, dyn)  the claims of the token a jwt-validation accepted (on_http_request); {} before
//	res.status_code            int      (on_http_response)
//	res.headers                map(string, list(string))  names in lower case
//
// # Functions
//
// CEL's standard library (RE2 matches among them), the string extensions
// (lowerAscii, split, replace, ...), and inCidrRange(ip, cidr) and
// inCidrRanges(ip, [cidr, ...]), as ngrok spells them. Nothing reaches the
// network or the clock (time.now is a variable).
//
// # Bounds
//
// A tenant writes the rules and the edge runs them, so compiling refuses an
// expression over MaxExpressionBytes (package policy), nested deeper than
// MaxRecursion, with comprehensions nested more than MaxComprehensionNesting
// deep, with a matches() pattern that is not a constant of at most
// policy.MaxRegexBytes, or whose estimated cost (with every list, map and
// string of a request at its bound: MaxEntries entries, MaxStringBytes
// bytes) is over Engine.MaxEstimatedCost. Evaluating stops at
// Engine.CostLimit: the request gets a 500 policy_error (package policy
// fails closed). An expression whose estimate, with every value at the
// most net/http lets a request or a response hold (WorstStringBytes,
// WorstEntries), is within the limit cannot reach it, and runs without
// counting its cost, which is about half of a cheap evaluation's.
package rules

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"

	"github.com/tunnelkit/tunnelkit/policy"
)

// The defaults and limits of compiling.
const (
	// DefaultCostLimit is the runtime cost an evaluation may spend when
	// Engine.CostLimit is zero: CEL's cost units, about one per
	// operation or per byte compared.
	DefaultCostLimit = 100_000

	// DefaultMaxEstimatedCost bounds an expression's estimated worst cost
	// when Engine.MaxEstimatedCost is zero.
	DefaultMaxEstimatedCost = 1_000_000

	// MaxRecursion bounds the nesting of an expression's syntax.
	MaxRecursion = 32

	// MaxComprehensionNesting bounds comprehensions (all, exists, map,
	// filter) inside each other.
	MaxComprehensionNesting = 2

	// MaxEntries and MaxStringBytes are the sizes the cost estimate
	// assumes of a request's lists and maps (headers, query parameters,
	// cookies) and of its strings.
	MaxEntries     = 256
	MaxStringBytes = 8192
)

// Engine compiles rules' expressions with CEL. The zero Engine uses the
// defaults; it is safe for concurrent use.
type Engine struct {
	// CostLimit bounds what one evaluation spends (CEL's runtime cost).
	// Zero: DefaultCostLimit.
	CostLimit uint64

	// MaxEstimatedCost bounds an expression's estimated worst cost at
	// compile time. Zero: DefaultMaxEstimatedCost.
	MaxEstimatedCost uint64

	// AllowPrivate lets jwt-validation fetch JWKS URLs at loopback,
	// private and other non-public addresses (a test server; a tenant
	// could then make the edge reach into its network). False: such URLs
	// are refused at bind, and connections to such addresses at dial.
	AllowPrivate bool

	// RootCAs verifies the JWKS servers' certificates. Nil: the system's.
	RootCAs *x509.CertPool

	// JWKSRefresh is the least time between fetches of a JWKS for a key
	// ID it does not hold. Zero: DefaultJWKSRefresh.
	JWKSRefresh time.Duration
}

var _ policy.Engine = Engine{}

// Bool implements policy.Engine.
func (e Engine) Bool(phase, expr string) (policy.BoolProgram, error) {
	return e.compileBool(phase, expr, policy.MaxExpressionBytes)
}

func (e Engine) compileBool(phase, expr string, maxBytes int) (policy.BoolProgram, error) {
	prg, err := e.compile(phase, expr, true, maxBytes)
	if err != nil {
		return nil, err
	}
	return func(v *policy.Vars) (bool, error) {
		out, err := eval(prg, v)
		if err != nil {
			return false, err
		}
		b, ok := out.(types.Bool)
		if !ok {
			return false, fmt.Errorf("yields %s, not a bool", out.Type())
		}
		return bool(b), nil
	}, nil
}

// All compiles exprs as one condition that holds when they all do
// (CEL's &&): one evaluation per request rather than one per expression,
// and one parse per bind. The bounds hold for them together. An error
// names the expression at fault when one is ("expressions[1]: column 5:
// ..."), checking each on its own.
func (e Engine) All(phase string, exprs []string) (policy.BoolProgram, error) {
	parts := make([]string, len(exprs))
	for i, x := range exprs {
		if len(x) > policy.MaxExpressionBytes {
			return nil, fmt.Errorf("expressions[%d]: %d bytes (at most %d)", i, len(x), policy.MaxExpressionBytes)
		}
		parts[i] = "(" + x + "\n)"
	}
	joined := strings.Join(parts, " && ")
	prog, err := e.compileBool(phase, joined, len(joined))
	if err == nil {
		return prog, nil
	}
	for i, x := range exprs {
		if _, _, err := e.check(phase, x, true, policy.MaxExpressionBytes); err != nil {
			return nil, fmt.Errorf("expressions[%d]: %w", i, err)
		}
	}
	return nil, fmt.Errorf("expressions, together: %w", err)
}

// String implements policy.Engine.
func (e Engine) String(phase, expr string) (policy.StringProgram, error) {
	prg, err := e.compile(phase, expr, false, policy.MaxExpressionBytes)
	if err != nil {
		return nil, err
	}
	return func(v *policy.Vars) (string, error) {
		out, err := eval(prg, v)
		if err != nil {
			return "", err
		}
		s := out.ConvertToType(types.StringType)
		if types.IsError(s) {
			return "", fmt.Errorf("a %s has no string form", out.Type())
		}
		return string(s.(types.String)), nil
	}, nil
}

func eval(prg cel.Program, v *policy.Vars) (ref.Val, error) {
	act, ok := v.Memo.(*activation)
	if !ok || act.v != v {
		act = &activation{v: v}
		v.Memo = act
	}
	out, _, err := prg.Eval(act)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// compile parses, checks, bounds and plans expr.
func (e Engine) compile(phase, expr string, wantBool bool, maxBytes int) (cel.Program, error) {
	env, a, err := e.check(phase, expr, wantBool, maxBytes)
	if err != nil {
		return nil, err
	}
	limit := e.CostLimit
	if limit == 0 {
		limit = DefaultCostLimit
	}
	// An expression that cannot cost more than the limit whatever the
	// request (its estimate with every value at the most a request can
	// hold) runs without tracking its cost, which is a good part of an
	// evaluation's; the others are tracked, without OptTrackState, which
	// would ignore the limit (cel-go #1425).
	if worst, err := env.EstimateCost(a, estimator{worst: true}); err == nil && worst.Max <= limit {
		return env.Program(a, cel.EvalOptions(cel.OptOptimize))
	}
	return env.Program(a, cel.CostLimit(limit), cel.EvalOptions(cel.OptOptimize))
}

// check parses and checks expr, and holds it to the bounds.
func (e Engine) check(phase, expr string, wantBool bool, maxBytes int) (*cel.Env, *cel.Ast, error) {
	env, err := envOf(phase)
	if err != nil {
		return nil, nil, err
	}
	if len(expr) > maxBytes {
		return nil, nil, fmt.Errorf("%d bytes (at most %d)", len(expr), maxBytes)
	}
	a, iss := env.Compile(expr)
	if iss.Err() != nil {
		return nil, nil, issuesError(iss)
	}
	if wantBool && !a.OutputType().IsExactType(types.BoolType) && !a.OutputType().IsExactType(types.DynType) {
		return nil, nil, fmt.Errorf("yields %s, not a bool", a.OutputType())
	}
	if err := checkRegexes(a); err != nil {
		return nil, nil, err
	}
	maxCost := e.MaxEstimatedCost
	if maxCost == 0 {
		maxCost = DefaultMaxEstimatedCost
	}
	est, err := env.EstimateCost(a, estimator{})
	if err != nil {
		return nil, nil, fmt.Errorf("its cost cannot be estimated: %v", err)
	}
	if est.Max > maxCost {
		return nil, nil, fmt.Errorf("its estimated cost, up to %d, is over the bound of %d (a comprehension over a request's lists, nested?)", est.Max, maxCost)
	}
	return env, a, nil
}

// issuesError is the first error of iss, with its column (1-based).
func issuesError(iss *cel.Issues) error {
	errs := iss.Errors()
	if len(errs) == 0 {
		return iss.Err()
	}
	e := errs[0]
	msg := strings.TrimSuffix(e.Message, " (in container '')")
	if e.Location != nil && e.Location.Line() > 0 {
		msg = fmt.Sprintf("column %d: %s", e.Location.Column()+1, msg)
	}
	if len(errs) > 1 {
		msg += fmt.Sprintf(" (and %d more)", len(errs)-1)
	}
	return errors.New(msg)
}

// checkRegexes refuses a matches() whose pattern is not a constant
// string of at most policy.MaxRegexBytes (RE2: no backtracking, but a
// pattern built from request data would be compiled on every request).
func checkRegexes(a *cel.Ast) error {
	var bad error
	ast.PreOrderVisit(ast.NavigateAST(a.NativeRep()), ast.NewExprVisitor(func(e ast.Expr) {
		if bad != nil || e.Kind() != ast.CallKind || e.AsCall().FunctionName() != "matches" {
			return
		}
		args := e.AsCall().Args()
		pat := args[len(args)-1]
		if pat.Kind() != ast.LiteralKind {
			bad = errors.New("matches() takes a constant pattern")
			return
		}
		s, ok := pat.AsLiteral().(types.String)
		if !ok {
			bad = errors.New("matches() takes a string pattern")
			return
		}
		if len(s) > policy.MaxRegexBytes {
			bad = fmt.Errorf("a matches() pattern of %d bytes (at most %d)", len(s), policy.MaxRegexBytes)
		}
	}))
	return bad
}

// estimator sizes the request's values at their bounds: the typical ones
// (MaxEntries, MaxStringBytes), or with worst, the most a request may
// hold (WorstEntries, WorstStringBytes).
type estimator struct{ worst bool }

// The most a request's or a response's values may hold: net/http reads
// at most 1 MiB of a request's header (http.DefaultMaxHeaderBytes, with
// its slack) and 10 MiB of a response's (http.Transport's default), so no
// string, and no count of headers, cookies or query parameters, is larger.
const (
	WorstStringBytes = 16 << 20
	WorstEntries     = 16 << 20
)

func (e estimator) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	strs, lists := uint64(MaxStringBytes), uint64(MaxEntries)
	if e.worst {
		strs, lists = WorstStringBytes, WorstEntries
	}
	switch n.Type().Kind() {
	case types.StringKind, types.BytesKind:
		return &checker.SizeEstimate{Min: 0, Max: strs}
	case types.ListKind, types.MapKind:
		return &checker.SizeEstimate{Min: 0, Max: lists}
	}
	return nil
}

func (estimator) EstimateCallCost(function, overloadID string, target *checker.AstNode, args []checker.AstNode) *checker.CallEstimate {
	switch function {
	case "inCidrRange":
		return &checker.CallEstimate{CostEstimate: checker.CostEstimate{Min: 1, Max: 10}}
	case "inCidrRanges":
		return &checker.CallEstimate{CostEstimate: checker.CostEstimate{Min: 1, Max: 10 * MaxEntries}}
	}
	return nil
}

// The variables of each phase.
var (
	stringList = cel.ListType(cel.StringType)
	multiMap   = cel.MapType(cel.StringType, stringList)

	connVars = []cel.EnvOption{
		cel.Variable("conn.client_ip", cel.StringType),
		cel.Variable("conn.client_port", cel.IntType),
		cel.Variable("conn.server_port", cel.IntType),
		cel.Variable("conn.tls.server_name", cel.StringType),
		cel.Variable("conn.tls.client_cert.subject", cel.StringType),
		cel.Variable("endpoint.url", cel.StringType),
		cel.Variable("endpoint.host", cel.StringType),
		cel.Variable("endpoint.protocol", cel.StringType),
		cel.Variable("time.now", cel.TimestampType),
	}
	reqVars = []cel.EnvOption{
		cel.Variable("req.method", cel.StringType),
		cel.Variable("req.url", cel.StringType),
		cel.Variable("req.url.raw", cel.StringType),
		cel.Variable("req.url.scheme", cel.StringType),
		cel.Variable("req.url.host", cel.StringType),
		cel.Variable("req.url.path", cel.StringType),
		cel.Variable("req.url.query", cel.StringType),
		cel.Variable("req.url.query_params", multiMap),
		cel.Variable("req.host", cel.StringType),
		cel.Variable("req.headers", multiMap),
		cel.Variable("req.cookies", multiMap),
		cel.Variable("req.content_length", cel.IntType),
		cel.Variable("req.user_agent", cel.StringType),
		cel.Variable("auth.user", cel.StringType),
		cel.Variable("auth.email", cel.StringType),
		cel.Variable("auth.subject", cel.StringType),
	}
	jwtVars = []cel.EnvOption{
		cel.Variable("actions.jwt.claims", cel.MapType(cel.StringType, cel.DynType)),
	}
	resVars = []cel.EnvOption{
		cel.Variable("res.status_code", cel.IntType),
		cel.Variable("res.headers", multiMap),
	}
)

var (
	envsOnce sync.Once
	envs     map[string]*cel.Env
	envsErr  error
)

// envOf returns the environment of phase, made once.
func envOf(phase string) (*cel.Env, error) {
	envsOnce.Do(func() {
		envs = map[string]*cel.Env{}
		for phase, vars := range map[string][][]cel.EnvOption{
			policy.PhaseTCPConnect:   {connVars},
			policy.PhaseHTTPRequest:  {connVars, reqVars, jwtVars},
			policy.PhaseHTTPResponse: {connVars, reqVars, resVars},
		} {
			opts := []cel.EnvOption{
				ext.Strings(),
				cel.ParserRecursionLimit(MaxRecursion),
				// Each expression is bounded by compile; a rule's
				// joined by All are up to MaxRuleExpressions of them.
				cel.ParserExpressionSizeLimit(policy.MaxRuleExpressions * (policy.MaxExpressionBytes + 8)),
				cel.ASTValidators(cel.ValidateComprehensionNestingLimit(MaxComprehensionNesting)),
				cidrFunctions,
			}
			for _, v := range vars {
				opts = append(opts, v...)
			}
			env, err := cel.NewEnv(opts...)
			if err != nil {
				envsErr = fmt.Errorf("rules: the environment of %s: %v", phase, err)
				return
			}
			envs[phase] = env
		}
	})
	if envsErr != nil {
		return nil, envsErr
	}
	env, ok := envs[phase]
	if !ok {
		return nil, fmt.Errorf("no phase %q", phase)
	}
	return env, nil
}

// cidrFunctions are inCidrRange and inCidrRanges.
var cidrFunctions = cel.Lib(cidrLib{})

type cidrLib struct{}

func (cidrLib) CompileOptions() []cel.EnvOption {
	return []cel.EnvOption{
		cel.Function("inCidrRange",
			cel.Overload("inCidrRange_string_string", []*cel.Type{cel.StringType, cel.StringType}, cel.BoolType,
				cel.BinaryBinding(func(ip, cidr ref.Val) ref.Val {
					return inRanges(ip, []ref.Val{cidr})
				}))),
		cel.Function("inCidrRanges",
			cel.Overload("inCidrRanges_string_list", []*cel.Type{cel.StringType, stringList}, cel.BoolType,
				cel.BinaryBinding(func(ip, list ref.Val) ref.Val {
					l, ok := list.(traits.Lister)
					if !ok {
						return types.NewErr("inCidrRanges: want a list")
					}
					n := int(l.Size().(types.Int))
					if n > MaxEntries {
						return types.NewErr("inCidrRanges: %d ranges (at most %d)", n, MaxEntries)
					}
					cidrs := make([]ref.Val, n)
					for i := range n {
						cidrs[i] = l.Get(types.Int(i))
					}
					return inRanges(ip, cidrs)
				}))),
	}
}

func (cidrLib) ProgramOptions() []cel.ProgramOption { return nil }

func inRanges(ip ref.Val, cidrs []ref.Val) ref.Val {
	s, ok := ip.(types.String)
	if !ok {
		return types.NewErr("inCidrRange: want an address string")
	}
	a, err := netip.ParseAddr(string(s))
	if err != nil {
		return types.Bool(false) // not an address: in no range
	}
	a = a.Unmap()
	for _, c := range cidrs {
		cs, ok := c.(types.String)
		if !ok {
			return types.NewErr("inCidrRange: want a CIDR string")
		}
		p, err := netip.ParsePrefix(string(cs))
		if err != nil {
			return types.NewErr("inCidrRange: %q is not a CIDR prefix", string(cs))
		}
		if p.Contains(a) {
			return types.Bool(true)
		}
	}
	return types.Bool(false)
}

// activation resolves the variables from a policy.Vars, computing each
// when an expression first reads it.
type activation struct {
	v        *policy.Vars
	clientIP string // conn.client_ip, once read (it does not change within a phase)
}

func (a *activation) Parent() interpreter.Activation { return nil }

func (a *activation) ResolveName(name string) (any, bool) {
	v := a.v
	r := v.Request
	switch name {
	case "conn.client_ip":
		if a.clientIP == "" {
			a.clientIP = v.Conn.Client.Addr().Unmap().String()
		}
		return a.clientIP, true
	case "conn.client_port":
		return int64(v.Conn.Client.Port()), true
	case "conn.server_port":
		return int64(v.Conn.ServerPort), true
	case "conn.tls.server_name":
		return v.Conn.ServerName, true
	case "conn.tls.client_cert.subject":
		return v.Conn.ClientCertSubject, true
	case "endpoint.url":
		return v.Endpoint.URL, true
	case "endpoint.host":
		return v.Endpoint.Host, true
	case "endpoint.protocol":
		return v.Endpoint.Protocol, true
	case "time.now":
		return v.Now, true
	case "auth.user":
		return v.Auth.User, true
	case "auth.email":
		return v.Auth.Email, true
	case "auth.subject":
		return v.Auth.Subject, true
	case "actions.jwt.claims":
		if v.JWT == nil {
			return map[string]any{}, true
		}
		return v.JWT, true
	}
	if r == nil {
		return nil, false
	}
	switch name {
	case "req.method":
		return r.Method, true
	case "req.url", "req.url.raw":
		return policy.RequestURL(r), true
	case "req.url.scheme":
		if r.TLS != nil {
			return "https", true
		}
		return "http", true
	case "req.url.host":
		host := r.Host
		if h, _, ok := strings.Cut(host, ":"); ok && !strings.HasPrefix(host, "[") {
			host = h
		} else if strings.HasPrefix(host, "[") {
			if i := strings.LastIndex(host, "]"); i > 0 {
				host = host[1:i]
			}
		}
		return host, true
	case "req.url.path":
		return r.URL.Path, true
	case "req.url.query":
		return r.URL.RawQuery, true
	case "req.url.query_params":
		return map[string][]string(r.URL.Query()), true
	case "req.host":
		return r.Host, true
	case "req.headers":
		return lowerHeaders(r.Header), true
	case "req.cookies":
		m := map[string][]string{}
		for _, c := range r.Cookies() {
			m[c.Name] = append(m[c.Name], c.Value)
		}
		return m, true
	case "req.content_length":
		return r.ContentLength, true
	case "req.user_agent":
		return r.UserAgent(), true
	}
	if v.Response == nil {
		return nil, false
	}
	switch name {
	case "res.status_code":
		return int64(v.Response.StatusCode), true
	case "res.headers":
		return lowerHeaders(v.Response.Header), true
	}
	return nil, false
}

func lowerHeaders(h http.Header) map[string][]string {
	m := make(map[string][]string, len(h))
	for k, vs := range h {
		l := strings.ToLower(k)
		m[l] = append(m[l], vs...)
	}
	return m
}
