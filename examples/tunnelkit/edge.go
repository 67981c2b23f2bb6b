package main

import "github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"

// The edge subcommand, "tunnelkit edge", runs a tunnel edge: agents
// connect on -agents; public HTTP requests on -http reach them by name
// under -domain; public TLS on -tls
// goes by server name to tls endpoints (passed through, never terminated)
// and https endpoints (terminated here, with -cert/-key or certificates
// from an ACME CA); TCP endpoints are opened on ports of -tcp-ports.
//
//	tunnelkit edge -agents 127.0.0.1:7000 -http 127.0.0.1:8080 -domain example.test \
//	     -tls 127.0.0.1:8443 -cert wildcard.pem -key wildcard-key.pem \
//	     -tcp-ports 20000-20100 -tokens tokens.txt -ticket-key ticket.key \
//	     -agent-cert edge.pem -agent-key edge-key.pem
//
//	tunnelkit edge -domain tunnel.example.com -http :80 -tls :443 \
//	     -acme-directory https://acme-v02.api.letsencrypt.org/directory \
//	     -acme-email ops@example.com -acme-cache /var/lib/edge/acme
//
// With a certificate, -tls takes agent sessions too (ALPN tunnelkit/1,
// see docs/PROTOCOL.md), and an empty -agents leaves out the agent port: one port
// for everything (-tls-agents=false turns agents on -tls off).
//
//	tunnelkit edge -domain example.com -http :80 -tls :443 -cert example.pem -key example-key.pem -agents ''
//
// A tokens file holds one "token identity" pair per line; blank lines and
// lines starting with # are skipped. Each identity owns the names its
// agents bind; agents of one identity may share a pool.
//
// With -etcd, edges share their routes through etcd (router/etcdrouter), and
// with -relay (and -relay-cert, -relay-key, -relay-ca) the others relay
// public connections to the agents this one holds: a cluster, where an
// agent connects to any edge and clients reach it through every one. An
// edge's relay certificate names its ID (-id, by default the -relay
// address) in the SAN URI:tunnelkit-edge://<ID>, for serverAuth and
// clientAuth; edges relay only for the edges registered in etcd. Whoever
// can write to etcd can route names and register edges: give etcd TLS
// client certificates (-etcd-cert, -etcd-key, -etcd-ca) from a CA of the
// edges' own.
//
//	tunnelkit edge -etcd https://10.0.0.9:2379 -etcd-cert e1-etcd.pem -etcd-key e1-etcd-key.pem \
//	     -etcd-ca etcd-ca.pem -relay 10.0.0.1:7443 -relay-cert e1.pem \
//	     -relay-key e1-key.pem -relay-ca edges-ca.pem -domain example.test ...
//
// -metrics ADDR serves Prometheus metrics at /metrics.
//
// -config FILE reads the settings from a YAML file: each flag's name, with
// _ for -, is a key; tokens and policy also take the tokens and the
// operator's policy themselves; ${VAR} takes its value from the
// environment; flags given win over the file (package edgecmd).
//
//	domain: example.com
//	http: :80
//	tls: :443
//	acme_directory: https://acme-v02.api.letsencrypt.org/directory
//	tokens:
//	  - token: ${TEAM_A_TOKEN}
//	    identity: team-a
//
// -admin ADDR serves /healthz for load balancers (200 while serving, 503
// while draining) and, with -admin-token-file, the control plane's API
// under /v1/ (sessions, endpoints, disconnect, reservations, drain; see
// docs/cluster.md). SIGTERM drains the edge: its
// agents move to other edges of the cluster, what is in flight finishes,
// and it exits within -drain-timeout. SIGINT shuts it down at once.
// SIGHUP reads the flags' files and the -config file again, and applies at
// once what changed of the tokens (inline ones too), the operator's policy,
// the limits (-max-*, -client-share, -conns-per-source...), the admin
// token and -log-level; it names the other settings that changed, which
// take a restart. A file that does not read changes nothing.
//
// With -token, -tokens or the -config file's tokens, agents need a token:
// a tokens setting that names none refuses every agent until a SIGHUP
// reads one. Without any, the edge takes any agent, each an identity of
// its own (-anonymous says so on purpose).
//
// Traffic policy: agents declare theirs with each endpoint (see the agent
// command); -policy FILE adds the operator's to every endpoint (the JSON
// form agents send, e.g. {"cidr_deny":["192.0.2.0/24"],"rate_limit":{"requests":100}}),
// -policy-kinds limits the kinds agents may declare, and -oidc lets them
// declare OpenID Connect logins (package policy/oidc):
//
//	tunnelkit edge -domain example.test -tls :443 -cert wildcard.pem -key wildcard-key.pem \
//	     -ticket-key ticket.key -policy operator-policy.json -oidc \
//	     -oidc-issuer-allowed https://accounts.google.com
//
// edgeMain runs "tunnelkit edge" with args: package edgecmd, with routes
// shared through etcd, Prometheus metrics and OpenID Connect logins.
func edgeMain(args []string) { edgecmd.Main("tunnelkit edge", args, edgeExtension()) }

// edgeExtension is what tunnelkit adds to package edgecmd.
func edgeExtension() *edgecmd.Extension {
	return both(new(cluster).extension(), new(logins).extension())
}
