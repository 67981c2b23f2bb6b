package policy

import (
	"net/http"
	"net/netip"
	"time"
)

// Engine compiles the expressions of rules: the conditions of a Rule, its
// "${...}" interpolations and a rate limit's bucket keys. Package
// github.com/tunnelkit/tunnelkit/policy/rules has one, on CEL (a module of
// its own, so that an app that imports package agent builds none of it).
// Without one (Options.Engine nil) Compile refuses a spec that has rules
// with ErrUnsupported; the kinds need none.
//
// An Engine compiles once per bind and must bound what it compiles (its
// size and its estimated cost) and what a program may cost when it runs.
// A compile error says where in expr it is (its column); Compile adds the
// phase, the rule's index and its name.
type Engine interface {
	// Bool compiles expr, a condition of a rule of phase (PhaseTCPConnect,
	// PhaseHTTPRequest, PhaseHTTPResponse), which must yield a bool.
	Bool(phase, expr string) (BoolProgram, error)

	// String compiles expr, the inside of a "${...}" or a bucket key,
	// which may yield any value that has a string form.
	String(phase, expr string) (StringProgram, error)
}

// BoolProgram is a compiled condition. An error is a failure to evaluate
// (the program went over its cost limit, say): the policy fails closed.
type BoolProgram func(*Vars) (bool, error)

// StringProgram is a compiled interpolation or bucket key; its errors are a
// BoolProgram's.
type StringProgram func(*Vars) (string, error)

// Vars are what a rule's expressions read, for one connection or request.
// The Engine maps them to variables (conn.client_ip, req.url.path, ...);
// only the fields of the phase are set.
type Vars struct {
	// Phase is the phase being run.
	Phase string

	// Conn is the client's connection.
	Conn Conn

	// Endpoint is the endpoint the traffic is for.
	Endpoint Endpoint

	// Request is the client's request (http phases; nil on connect), as
	// the rules before have changed it.
	Request *http.Request

	// Response is the app's response (on_http_response; else nil).
	Response *http.Response

	// Auth is who a login of this request established: empty fields
	// when none did.
	Auth Auth

	// Now is when the phase started.
	Now time.Time

	// JWT holds the claims of the token a jwt-validation action of this
	// request accepted; nil before one did.
	JWT map[string]any

	// Memo is the Engine's, for one phase: what its programs keep
	// between evaluations (nil at the start of each phase).
	Memo any
}

// Conn describes a client's connection.
type Conn struct {
	Client     netip.AddrPort // the client's address and port
	ServerPort int            // the edge's port the client connected to; 0: unknown
	ServerName string         // the TLS server name (SNI); "" without TLS

	// ClientCertSubject is the subject of the client certificate that
	// mutual_tls verified, RFC 2253; "" without one.
	ClientCertSubject string
}

// Endpoint describes the endpoint traffic is for.
type Endpoint struct {
	URL      string // e.g. "https://app.example.com/api"
	Host     string // e.g. "app.example.com"
	Protocol string // ProtoHTTP, ProtoHTTPS, ProtoTLS or ProtoTCP
}

// Auth is the identity a login established.
type Auth struct {
	User    string // basic auth's user
	Email   string // an oidc login's verified e-mail address
	Subject string // an oidc login's subject
}

// The phases of rules: members of a Spec, as ngrok names them.
const (
	PhaseTCPConnect   = "on_tcp_connect"   // tcp and tls endpoints: each connection
	PhaseHTTPRequest  = "on_http_request"  // http and https: each request, before the app
	PhaseHTTPResponse = "on_http_response" // http and https: each response of the app
)

// clientAddrPort is the client's address with the port of remoteAddr when
// it is the same address (a request's RemoteAddr).
func clientAddrPort(client netip.Addr, remoteAddr string) netip.AddrPort {
	if remoteAddr == "" {
		return netip.AddrPortFrom(client, 0)
	}
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil && ap.Addr().Unmap() == client.Unmap() {
		return netip.AddrPortFrom(client, ap.Port())
	}
	return netip.AddrPortFrom(client, 0)
}
