package oidc_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/policy/oidc"
)

// An edge hands Providers.Provider to policy.Compile. Agents choose their
// issuers, so by default the edge will not fetch one on its own network.
func ExampleProviders() {
	providers := &oidc.Providers{} // the system's roots, public issuers only
	defer providers.CloseIdleConnections()
	opts := policy.Options{
		OIDC:      providers.Provider,
		CookieKey: []byte("32 or more secret bytes, shared by the edges"),
	}
	spec := policy.Spec{OIDC: &policy.OIDC{
		Issuer:      "https://127.0.0.1:9443", // the operator's own network
		ClientID:    "app",
		AllowEmails: []string{"ann@example.com"},
	}}
	_, err := policy.Compile(context.Background(), policy.ProtoHTTPS, spec, opts)
	fmt.Println(errors.Is(err, policy.ErrForbidden), errors.Is(err, oidc.ErrPrivateAddress))
	// Output:
	// true true
}
