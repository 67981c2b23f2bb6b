package policy

import "errors"

// The errors of this package. Errors of Parse, Validate, Combine and Compile
// wrap one of them (check with errors.Is); their text says which kind and
// which entry is at fault, never a secret.
var (
	// ErrInvalid means a spec is malformed: bad JSON, a field of the wrong
	// type, an unknown field inside a kind, or a value that cannot be
	// right (a bad CIDR, an unknown webhook provider, a header that may
	// not be changed). An edge answers it with wire code bad_request.
	ErrInvalid = errors.New("policy: invalid spec")

	// ErrUnknownKind means a spec names a kind this package does not know
	// (a top-level JSON field). The error names the kind. An edge refuses
	// such a bind, as it refuses unknown bind options, so that no agent
	// believes a policy holds that its edge ignores.
	ErrUnknownKind = errors.New("policy: unknown kind")

	// ErrProtocol means a kind does not fit the endpoint's protocol (basic
	// auth on a tcp endpoint, OIDC on plain http), or two kinds that
	// cannot hold together on one endpoint (OIDC with basic auth or a
	// webhook check).
	ErrProtocol = errors.New("policy: kind does not fit the endpoint")

	// ErrTooLarge means a spec exceeds one of the bounds (MaxCIDRs,
	// MaxCredentials, ...): the edge does only bounded work per bind and
	// per request.
	ErrTooLarge = errors.New("policy: spec exceeds a bound")

	// ErrForbidden means the operator does not let agents declare a kind
	// (Operator.Kinds) or an OIDC issuer (Operator.OIDCIssuers).
	ErrForbidden = errors.New("policy: not allowed by the operator")

	// ErrConflict means the operator's policy and the agent's both set a
	// kind that cannot be combined (one login, one client CA set, one
	// webhook check per endpoint).
	ErrConflict = errors.New("policy: the operator's policy sets this kind already")

	// ErrUnsupported means the edge cannot enforce a kind: an OIDC policy
	// compiled without Options.OIDC or Options.CookieKey.
	ErrUnsupported = errors.New("policy: not supported by this edge")

	// ErrUnavailable means Compile could not reach something it needs
	// now (the OIDC provider's discovery document); the same bind may
	// succeed later. An edge answers it with wire code unavailable.
	ErrUnavailable = errors.New("policy: unavailable")
)
