// Package policy is traffic policy for tunnel endpoints: the rules an agent
// declares with an endpoint (and an operator sets for an edge) that the edge
// enforces before it opens a stream to the agent. A Spec is plain data whose
// JSON form travels in the bind; Compile turns it, once per bind, into a
// Policy that answers each connection and request cheaply.
//
// Typical use, in an edge:
//
//	spec, err := policy.Parse(bind.Policy) // strict: unknown kinds refused
//	if err != nil { ... }                  // bad_request
//	spec, err = policy.Combine(bind.Proto, operator, spec)
//	if err != nil { ... }                  // bad_request
//	pol, err := policy.Compile(ctx, bind.Proto, spec, opts)
//	if err != nil { ... }                  // unavailable if errors.Is(err, policy.ErrUnavailable), else bad_request
//	...
//	// tls and tcp endpoints, per accepted connection:
//	if _, ok := pol.AcceptConn(client); !ok {
//		conn.Close() // before the agent is dialled
//	}
//	// http and https endpoints, per request, nil policies too:
//	if pol.Check(w, r, client) {
//		return // refused, or answered (a login)
//	}
//	proxy.ServeHTTP(w, r) // whose ModifyResponse calls pol.RewriteResponse(resp.Header)
//
// and in an agent:
//
//	l, err := client.ListenEndpoint(ctx, agent.Endpoint{
//		URL: "https://app",
//		Policy: &policy.Spec{
//			CIDRDeny:  []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
//			BasicAuth: &policy.BasicAuth{Credentials: []string{"ann:s3cret"}},
//			RateLimit: &policy.RateLimit{Requests: 20},
//		},
//	})
//
// # Kinds
//
// Each kind is a field of Spec and a member of its JSON form:
//
//	kind              protocols             refusal
//	cidr_allow        http https tls tcp    403 policy_denied; tls/tcp: closed
//	cidr_deny         http https tls tcp    403 policy_denied; tls/tcp: closed
//	rate_limit        http https tls tcp    429 rate_limited + Retry-After; tls/tcp: closed
//	mutual_tls        https                 403 policy_denied (no certificate of its CAs)
//	basic_auth        http https            401 unauthorized + WWW-Authenticate
//	oidc              https                 302 to the login; 401 unauthorized (not GET/HEAD);
//	                                        403 policy_denied (account); 403 login_failed (callback)
//	webhook           http https            413 body_too_large; 403 webhook_invalid
//	request_headers   http https            -
//	response_headers  http https            -
//
// Validate refuses a kind that does not fit the endpoint's protocol, oidc
// with basic_auth (one login per request) and oidc with webhook (a webhook
// sender cannot log in).
//
// # Order of checks
//
// Check answers, in this order, and stops at the first refusal:
//
//  1. Reserved headers: every request header whose name reads as one
//     that starts with "Tunnelkit-", with '_' and '.' read as '-' and the
//     case folded, as app stacks read names (CGI and PHP take
//     Tunnelkit_Auth_User for Tunnelkit-Auth-User), is removed, whatever
//     the policy, even a nil one; so is every X-Forwarded-* and Forwarded
//     header not spelled canonically (the edge appends to the canonical
//     ones), and every request trailer named like any of them. The
//     identity headers below are the edge's alone.
//  2. Address (cidr_allow, cidr_deny): is the client's address allowed?
//     Deny wins over allow; an empty allow list is no list. First, because
//     it costs nothing and a refused client spends no rate-limit memory.
//  3. Rate limit: has this client source (an IPv4 address, an IPv6 /64)
//     tokens left? Before any credential is looked at, so that guessing
//     passwords is rate limited too.
//  4. Client certificate (mutual_tls): does one of the connection's
//     verified chains end in one of the policy's CAs? Sets
//     Tunnelkit-Client-Cert-Subject.
//  5. Login: basic_auth (are the credentials one of the pairs? sets
//     Tunnelkit-Auth-User, and removes Authorization unless
//     pass_authorization), or oidc (does the request carry a valid session
//     cookie for an allowed account? sets Tunnelkit-Auth-Email and
//     Tunnelkit-Auth-Subject; otherwise the login runs, see below).
//  6. Webhook: is the body, read once and at most Options.MaxWebhookBody
//     bytes, signed by the provider? The body goes on to the app intact.
//     Last of the checks, because it is the only one that reads the body.
//  7. Request headers (request_headers): remove, then add (an added name's
//     values replace the request's), on the request that goes to the app.
//
// RewriteResponse applies response_headers, likewise, to the app's
// response. AcceptConn runs steps 2 and 3 for a tls or tcp connection.
//
// # Combining an operator's policy with an agent's
//
// Combine merges an Operator's Policy (for the whole edge, or one
// identity's endpoints: the edge chooses which) with an agent's spec, kind
// by kind, leaving out the operator's kinds that do not fit the endpoint:
//
//   - cidr_deny: the union. A client either denies is refused.
//   - cidr_allow: the intersection. A client must be in both lists when
//     both have one; if no address is in both, everyone is refused.
//   - rate_limit: the lower rate of the two (requests per second).
//   - request_headers, response_headers: the agent's changes, then the
//     operator's: the operator's removals also drop the agent's additions
//     of those names, and the operator's additions replace the agent's of
//     the same name.
//   - basic_auth, oidc, mutual_tls, webhook: one login, one CA set, one
//     signature per endpoint: set by one party or the other; by both is
//     ErrConflict.
//
// The Operator also caps what agents may declare: Kinds (which kinds) and
// OIDCIssuers (which issuers). The combined spec is validated as a whole,
// against the same bounds.
//
// # Bounds
//
// A spec is bounded so that a bind costs bounded memory and a request
// bounded work (ErrTooLarge): MaxSpecBytes of JSON, MaxCIDRs prefixes per
// list (matched in O(log n), without allocating), MaxCredentials basic
// pairs of MaxCredentialBytes, MaxOIDCAllow e-mails and domains,
// MaxPEMBytes and MaxCAs of client CAs, MaxRateRequests per MaxRateSeconds
// at most, MaxHeaderOps header changes of MaxHeaderBytes per list, and
// MaxSecretBytes, MaxURLBytes and MaxIDBytes per string. At run time, a
// rate limit remembers at most Options.RateLimitClients sources
// (evicting, see below), and a webhook check reads at most
// Options.MaxWebhookBody bytes.
//
// # Rate limits
//
// Each client source has a token bucket of Requests tokens, refilled at
// Requests per Seconds. The table of buckets is bounded, whatever the
// number of addresses that appear: when it is full, a new source takes the
// slot of one whose bucket is full again, or of one not seen lately. An
// evicted source comes back with a full bucket, so a flood of addresses
// can loosen the limit of others, never exhaust the edge's memory.
//
// # Basic auth
//
// Credentials are checked with one HMAC-SHA256 under a random key of the
// compiled Policy and a constant-time comparison with every pair's hash:
// the Policy keeps no password in clear, and a request costs the same
// whichever user it names. Credentials are never logged.
//
// # OpenID Connect
//
// An oidc policy runs the authorization-code flow with PKCE on the
// endpoint's own host. A request without a valid session goes to the
// provider's login (GET and HEAD; other methods get 401), with a fresh
// state, nonce and PKCE verifier kept in a short-lived login cookie. The
// provider sends the browser back to CallbackPath, where the edge checks
// the state against the cookie, redeems the code with the verifier,
// verifies the ID token (through the Provider) and its nonce, and lets in
// an account whose e-mail address is verified and allowed: it sets the
// session cookie and goes back to the page first asked for. LogoutPath
// ends the session. A browser runs one login at a time: one started
// before the last came back replaces it, and the older callback fails
// (403 login_failed; opening the site again starts afresh).
//
// Both cookies are host-only (__Host- names: Secure, Path=/, no Domain),
// HttpOnly and SameSite=Lax, encrypted and authenticated with AES-256-GCM
// under a key derived from Options.CookieKey, and bound to their purpose,
// the host name and the issuer and client: a cookie never opens on another
// endpoint. Edges sharing the key accept each other's cookies. A session
// lasts Options.SessionLifetime, whatever the ID token's expiry; an
// expired, tampered or foreign cookie starts a new login. The app never
// sees these cookies. The Provider comes from Options.OIDC, at bind time;
// package github.com/tunnelkit/tunnelkit/policy/oidc (a module of its own,
// so that the core needs no OAuth library) implements it.
//
// # Mutual TLS
//
// mutual_tls carries the CAs as PEM in the bind. The edge asks clients of
// the endpoint's name (and only those) for a certificate, in its
// tls.Config.GetConfigForClient:
//
//	cfg.ClientAuth = tls.VerifyClientCertIfGiven
//	cfg.ClientCAs = pol.ClientCAs()
//
// VerifyClientCertIfGiven rather than RequireAndVerifyClientCert, so that a
// browser without a certificate gets Check's readable 403 rather than a
// TLS alert. Check then requires a chain that ends in one of the policy's
// CAs, which also stops an HTTP/2 connection whose certificate was checked
// for another name.
//
// # Webhooks
//
// The signature schemes, each HMAC-SHA256 with the secret as key, in hex:
//
//	github  X-Hub-Signature-256: sha256=HMAC(body)
//	stripe  Stripe-Signature: t=T,v1=HMAC(T "." body) (any v1 may match; T within WebhookTolerance)
//	slack   X-Slack-Signature: v0=HMAC("v0:" T ":" body), T the X-Slack-Request-Timestamp (within WebhookTolerance)
//
// # Headers
//
// A policy may not touch: Host (routing), hop-by-hop headers and
// Content-Length (message framing: changing them breaks or smuggles
// requests), X-Forwarded-For, -Proto, -Host and Forwarded on requests (the
// edge writes exactly one hop after the policy), nor an X-Forwarded-* name
// spelled with '_' or '.' on requests, and any name that reads as a
// Tunnelkit-* one (the edge's), with '_' and '.' as '-'. Validate refuses
// them (ErrInvalid) rather than ignore them.
package policy
