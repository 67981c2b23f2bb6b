package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"
	"github.com/tunnelkit/tunnelkit/policy/oidc"
	"github.com/tunnelkit/tunnelkit/policy/rules"
)

// logins lets agents declare OpenID Connect logins (package policy/oidc,
// a module of its own that the core does not build).
type logins struct {
	enable, private *bool
	ca              *string
}

func (l *logins) extension() *edgecmd.Extension {
	return &edgecmd.Extension{Flags: l.flags, Configure: l.configure}
}

func (l *logins) flags(fs *flag.FlagSet) {
	l.enable = fs.Bool("oidc", false, "let agents declare OpenID Connect logins (-oidc-issuer of the agent; https endpoints): the edge fetches the discovery document of the issuer an agent names (public addresses only, bounded in time and size; -oidc-issuer-allowed names the only ones) and keeps people's sessions in cookies sealed under a key derived from -ticket-key (without it, logins end with a restart)")
	l.ca = fs.String("oidc-ca", "", "with -oidc, PEM file of the CA that signs the OpenID providers' and the JWKS servers' HTTPS certificates (a test CA; default: the system's roots)")
	l.private = fs.Bool("oidc-allow-private", false, "with -oidc, let OpenID providers, and the JWKS URLs of jwt-validation rules, be at loopback and private addresses (a test provider; an agent could then make the edge reach into its network)")
}

func (l *logins) configure(_ context.Context, srv *edge.Server, log *slog.Logger) (func(), error) {
	if !*l.enable {
		if *l.ca != "" || *l.private {
			return nil, errors.New("-oidc-ca and -oidc-allow-private need -oidc")
		}
		return func() {}, nil
	}
	ps := &oidc.Providers{AllowPrivateNetworks: *l.private}
	if *l.ca != "" {
		pem, err := os.ReadFile(*l.ca)
		if err != nil {
			return nil, fmt.Errorf("-oidc-ca: %w", err)
		}
		ps.RootCAs = x509.NewCertPool()
		if !ps.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-oidc-ca %s: no PEM certificate", *l.ca)
		}
	}
	if len(srv.TicketKey) == 0 {
		log.Warn("-oidc without -ticket-key: people's logins end when the edge restarts")
	}
	srv.OIDC = ps.Provider
	// jwt-validation's JWKS fetches obey the same: private addresses
	// with -oidc-allow-private alone, the CA of -oidc-ca.
	srv.PolicyEngine = rules.Engine{AllowPrivate: ps.AllowPrivateNetworks, RootCAs: ps.RootCAs}
	return ps.CloseIdleConnections, nil
}

// both is an Extension made of a and b: a's flags and setup first, b's
// released first.
func both(a, b *edgecmd.Extension) *edgecmd.Extension {
	return &edgecmd.Extension{
		Flags: func(fs *flag.FlagSet) {
			a.Flags(fs)
			b.Flags(fs)
		},
		Configure: func(ctx context.Context, srv *edge.Server, log *slog.Logger) (func(), error) {
			releaseA, err := a.Configure(ctx, srv, log)
			if err != nil {
				return nil, err
			}
			releaseB, err := b.Configure(ctx, srv, log)
			if err != nil {
				releaseA()
				return nil, err
			}
			return func() { releaseB(); releaseA() }, nil
		},
	}
}
