package edge

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/hashicorp/go-multierror"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Errors of the edge, to check with errors.Is.
var (
	// ErrNoSession: the agent session of a route is not held by this
	// edge (it ended, or another edge holds it).
	ErrNoSession = errors.New("edge: agent session not found")
	// ErrServerClosed: the Server was closed or shut down. The Serve
	// methods return it then; it wraps net.ErrClosed.
	ErrServerClosed = fmt.Errorf("edge: server closed: %w", net.ErrClosed)
	// ErrAppUnreachable: the agent could not hand a connection to its app
	// (its dial failed); the conn from DialRoute reports it on Read.
	ErrAppUnreachable = errors.New("edge: the agent could not reach its app")
	// ErrAppDown: the endpoint's app is down, as its agent's health check
	// says (agent.HealthCheck): no connection was sent to it. It wraps
	// ErrAppUnreachable.
	ErrAppDown = fmt.Errorf("edge: the app is down, as its agent's health check says: %w", ErrAppUnreachable)
	// ErrNoEndpoint: the agent no longer serves the endpoint a connection
	// was sent to (its listener was closed).
	ErrNoEndpoint = errors.New("edge: the agent no longer serves the endpoint")
	// ErrReservationsUnsupported: the Router is not a router.Reserver.
	ErrReservationsUnsupported = errors.New("edge: the Router keeps no reservations")
	// ErrInvalidReservation: what Server.Reserve cannot reserve.
	ErrInvalidReservation = errors.New("edge: invalid reservation")
	// ErrReservationLimit: Server.Reserve would pass Limits.Reservations
	// or Limits.ReservationsPerIdentity.
	ErrReservationLimit = errors.New("edge: too many reservations")
	// ErrInvalidIdentity: what CheckIdentity refuses.
	ErrInvalidIdentity = errors.New("edge: invalid identity")
)

// Reason is why the edge refused an agent, a connection or a request: a
// short stable code. The same codes name the refusal in the edge's logs,
// in the Observer's Refused calls (and so in metrics), and, for HTTP, in
// the Tunnelkit-Error header and the body of the error page the client
// gets.
type Reason string

// Refusals of public HTTP requests, each answered with the status its
// comment gives.
const (
	ReasonBadRequest         Reason = "bad_request"         // 400: a malformed request or request body
	ReasonMissingHost        Reason = "missing_host"        // 400: no Host header
	ReasonNoEndpoint         Reason = "no_endpoint"         // 404: no tunnel has that name
	ReasonHTTPSOnly          Reason = "https_only"          // 404: the name is bound over https only (see RedirectHTTP)
	ReasonBodyTimeout        Reason = "body_timeout"        // 408: the request body stopped moving (Timeouts.Body)
	ReasonMisdirected        Reason = "misdirected"         // 421: an HTTP/2 connection reused for a name it cannot serve
	ReasonClientLimit        Reason = "client_limit"        // 429: the client holds its share of the endpoint (Limits.ClientShare)
	ReasonAgentOffline       Reason = "agent_offline"       // 502: no agent of the endpoint could be reached
	ReasonAppUnreachable     Reason = "app_unreachable"     // 502: the agent could not connect to its app
	ReasonAppUnhealthy       Reason = "app_unhealthy"       // 503: the app of every member of the endpoint is down, as their agents' health checks say (Retry-After)
	ReasonAppError           Reason = "app_error"           // 502: the app closed the connection without a whole response
	ReasonAgentBusy          Reason = "agent_busy"          // 503: the agent's session is at Limits.StreamsPerSession
	ReasonRoutingUnavailable Reason = "routing_unavailable" // 503: the Router failed
	ReasonAppTimeout         Reason = "app_timeout"         // 504: the app did not answer in time (Timeouts.ResponseHeader)
)

// Refusals of traffic policies (package policy, Server.Policy): a request
// to an http or https endpoint is answered with the status given, and a
// connection to a tls or tcp endpoint closed, before the agent is reached.
// The codes are package policy's (policy.CodePolicyDenied, ...).
const (
	ReasonPolicyDenied   Reason = "policy_denied"   // 403: the client's address, certificate or account is not allowed
	ReasonUnauthorized   Reason = "unauthorized"    // 401: basic credentials missing or wrong, or an OIDC login needed (not GET or HEAD)
	ReasonRateLimited    Reason = "rate_limited"    // 429: the client source's rate limit is spent (Retry-After says when to come back)
	ReasonWebhookInvalid Reason = "webhook_invalid" // 403: no valid webhook signature
	ReasonBodyTooLarge   Reason = "body_too_large"  // 413: a webhook body larger than the edge verifies
	ReasonLoginFailed    Reason = "login_failed"    // 403: an OIDC login callback that does not complete a login
	ReasonPolicyError    Reason = "policy_error"    // 500: a rule of the policy could not be evaluated (over its cost limit, say): fail closed

	// ReasonPolicyUnavailable: the policy of an endpoint that another
	// edge bound could not be set up on this one (an OIDC provider out of
	// reach, an operator policy that refuses it): 503, and tls and tcp
	// connections closed, rather than let traffic through unchecked.
	ReasonPolicyUnavailable Reason = "policy_unavailable"
)

// Refusals of agents, and of public TLS and TCP connections (which are
// closed).
const (
	ReasonAuth          Reason = "auth"           // an agent's token was refused
	ReasonAuthThrottled Reason = "auth_throttled" // an agent conn closed at accept for its source's failures (Limits.AuthFailures)
	ReasonSessionLimit  Reason = "session_limit"  // a hello past Limits.SessionsPerIdentity
	ReasonPendingLimit  Reason = "pending_limit"  // a conn evicted for Limits.PendingSessions or PendingSessionsPerSource
	ReasonEndpointLimit Reason = "endpoint_limit" // a bind past Limits.EndpointsPerSession
	ReasonNoRoute       Reason = "no_route"       // a TLS or TCP connection for a name or port no agent serves
	ReasonStalled       Reason = "stalled"        // a stream cut because its client stopped reading and its session held Limits.SessionUnread

	// Binds past the edge's quotas of endpoints (see Limits).
	ReasonIdentityEndpointLimit Reason = "identity_endpoint_limit" // past Limits.EndpointsPerIdentity
	ReasonSourceEndpointLimit   Reason = "source_endpoint_limit"   // an anonymous agent's, past Limits.EndpointsPerSource
	ReasonEdgeEndpointLimit     Reason = "edge_endpoint_limit"     // past Limits.Endpoints

	// ReasonBindRefused: a bind refused for another reason than the
	// quotas above (a name taken, a policy the edge cannot enforce, a
	// malformed request). ReasonBindThrottled: a bind that waited, or was
	// refused at once, for its owner's refused binds (Limits.RefusedBinds).
	ReasonBindRefused   Reason = "bind_refused"
	ReasonBindThrottled Reason = "bind_throttled"

	// ReasonProxyUntrusted: a connection to the HTTP or TLS port from an
	// address outside Server.ProxyProtocolFrom started with a PROXY
	// protocol header, a client trying to choose its address (or a load
	// balancer missing from the list); it was closed.
	ReasonProxyUntrusted Reason = "proxy_untrusted"

	// ReasonConnLimit: a public connection closed as it was accepted, its
	// client source holding Limits.ConnsPerSource connections on that
	// listener already.
	ReasonConnLimit Reason = "conn_limit"

	// ReasonHandshakeLimit: a connection for a name whose TLS the edge
	// terminates, closed before its handshake, its client source having
	// had Limits.HandshakesPerSource handshakes under way for as long as
	// Timeouts.Handshake (or the edge closing meanwhile).
	ReasonHandshakeLimit Reason = "handshake_limit"

	// ReasonACMEBudget: a terminated TLS handshake failed for a name that
	// has no certificate yet, because ACME's order budget (ACME's
	// OrdersPerHour, OrdersPerWeek, OrdersPerIdentity, IdentityShare)
	// refused to order one now.
	ReasonACMEBudget Reason = "acme_budget"

	// ReasonRelayRefused: a peer of Relay.Serve was refused a relay
	// session (its TLS handshake failed, or its certificate names no edge
	// of the cluster), or a relay session's stream named no route this
	// edge holds (one that just went, or a forged one); it was closed.
	ReasonRelayRefused Reason = "relay_refused"
)

// Reasons returns every Reason the edge reports, in a fixed order: the
// bounded set a metric may use as label values.
func Reasons() []Reason {
	return []Reason{
		ReasonAuth, ReasonAuthThrottled, ReasonSessionLimit, ReasonPendingLimit, ReasonEndpointLimit, ReasonStalled,
		ReasonIdentityEndpointLimit, ReasonSourceEndpointLimit, ReasonEdgeEndpointLimit, ReasonBindRefused, ReasonBindThrottled,
		ReasonNoRoute, ReasonNoEndpoint, ReasonClientLimit, ReasonAgentBusy, ReasonAgentOffline,
		ReasonAppUnreachable, ReasonAppUnhealthy, ReasonAppError, ReasonAppTimeout, ReasonBodyTimeout,
		ReasonBadRequest, ReasonMissingHost, ReasonHTTPSOnly, ReasonMisdirected,
		ReasonRoutingUnavailable, ReasonProxyUntrusted, ReasonConnLimit, ReasonHandshakeLimit,
		ReasonACMEBudget, ReasonRelayRefused,
		ReasonPolicyDenied, ReasonUnauthorized, ReasonRateLimited, ReasonWebhookInvalid, ReasonBodyTooLarge,
		ReasonLoginFailed, ReasonPolicyUnavailable, ReasonPolicyError,
	}
}

// status is the HTTP status a refusal is answered with; 0 for a Reason
// that never answers an HTTP request.
func (r Reason) status() int {
	switch r {
	case ReasonBadRequest, ReasonMissingHost:
		return http.StatusBadRequest
	case ReasonUnauthorized:
		return http.StatusUnauthorized
	case ReasonPolicyDenied, ReasonWebhookInvalid, ReasonLoginFailed:
		return http.StatusForbidden
	case ReasonNoEndpoint, ReasonHTTPSOnly:
		return http.StatusNotFound
	case ReasonBodyTimeout:
		return http.StatusRequestTimeout
	case ReasonBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case ReasonMisdirected:
		return http.StatusMisdirectedRequest
	case ReasonClientLimit, ReasonRateLimited:
		return http.StatusTooManyRequests
	case ReasonAgentBusy, ReasonRoutingUnavailable, ReasonPolicyUnavailable, ReasonAppUnhealthy:
		return http.StatusServiceUnavailable
	case ReasonAppTimeout:
		return http.StatusGatewayTimeout
	case ReasonPolicyError:
		return http.StatusInternalServerError
	case ReasonAgentOffline, ReasonAppUnreachable, ReasonAppError:
		return http.StatusBadGateway
	}
	return 0
}

// refuse answers a request the edge does not pass on (see answer), with
// no detail for the public.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, reason Reason, msg string, err error) {
	s.answer(w, r, reason, msg, err, false)
}

// headerRequestID names the ID of an error answer, the edge's or an
// agent's forwarder's, which the logs keep with the detail.
const headerRequestID = "Tunnelkit-Request-Id"

// answer answers a request the edge does not pass on: with the Reason's
// status, the Reason in the Tunnelkit-Error header, a new request ID in
// the Tunnelkit-Request-Id header, and a plain-text body that says what
// happened in words (msg, which names nothing but what the client sent),
// with the Reason and the ID. It logs the ID with err, the cause, which
// the client gets only with verbose (the route's VerboseErrors).
func (s *Server) answer(w http.ResponseWriter, r *http.Request, reason Reason, msg string, err error, verbose bool) {
	s.answerStatus(w, r, reason, 0, msg, err, verbose)
}

// answerStatus is answer with the status given, when not 0, rather than
// the reason's (a policy's deny with a status_code of its own).
func (s *Server) answerStatus(w http.ResponseWriter, r *http.Request, reason Reason, status int, msg string, err error, verbose bool) {
	if status == 0 {
		status = reason.status()
	}
	if status == 0 {
		status = http.StatusBadGateway
	}
	id := newRequestID()
	// What a client did wrong is the client's business, and attackers
	// would choose the log's volume: only what went wrong on the edge's or
	// the agent's side is logged at Info.
	level := slog.LevelDebug
	if status >= 500 {
		level = slog.LevelInfo
	}
	s.log().Log(r.Context(), level, "http error", "status", status, "code", string(reason), "request_id", id, "host", wire.Printable(r.Host, 256), "client", r.RemoteAddr, "err", err)
	s.obs().Refused(reason)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Tunnelkit-Error", string(reason))
	h.Set(headerRequestID, id)
	if r.ContentLength != 0 && r.ProtoMajor == 1 {
		// Close rather than read what is left of the body first, as
		// net/http would: a client that sends it slowly, or never, would
		// hold the connection for as long as it likes. (HTTP/2 resets
		// the stream alone; "Connection: close" would end the whole
		// connection, every other stream's too.)
		h.Set("Connection", "close")
	}
	w.WriteHeader(status)
	body := string(reason) + ": " + wire.Printable(msg, 1024) + "\nrequest id: " + id + "\n"
	if verbose && err != nil {
		body += "detail: " + wire.Printable(err.Error(), 1024) + "\n"
	}
	io.WriteString(w, body)
}

// newRequestID returns a new random request ID: 16 hex digits.
func newRequestID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// errorList gathers errors into one, written on one line (go-multierror's
// own format spreads a list over several, which breaks log lines).
type errorList struct{ m *multierror.Error }

func (l *errorList) add(err error) {
	l.m = multierror.Append(l.m, err)
	l.m.ErrorFormat = oneLine
}

// err returns the gathered errors as one, or nil for none.
func (l *errorList) err() error { return l.m.ErrorOrNil() }

// oneLine is a multierror.ErrorFormatFunc: "a; b; c", or the one error's
// text alone.
func oneLine(errs []error) string {
	parts := make([]string, len(errs))
	for i, err := range errs {
		parts[i] = err.Error()
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return fmt.Sprintf("%d errors: %s", len(parts), strings.Join(parts, "; "))
}
