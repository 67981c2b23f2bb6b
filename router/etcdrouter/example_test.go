package etcdrouter_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/router/etcdrouter"
)

// An edge of a cluster whose edges share names through etcd. Whoever can
// write to etcd decides where names go and which edges are members, so
// the client speaks TLS with a certificate that etcd requires
// (--client-cert-auth) from a CA of the edges' own. (It needs an etcd
// server, so it runs nothing here.)
func ExampleNew() {
	var (
		etcdClientCert tls.Certificate // this edge's, for etcd
		etcdCA         *x509.CertPool  // signs etcd's server certificate
	)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379", "https://10.0.0.3:2379"},
		TLS:         &tls.Config{Certificates: []tls.Certificate{etcdClientCert}, RootCAs: etcdCA},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt, err := etcdrouter.New(ctx, etcdrouter.Config{Client: cli, Edge: "edge-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close() // revokes this edge's lease: its routes go at once

	srv := &edge.Server{
		Domain: "tunnel.example.com",
		ID:     "edge-1", // the Router's Edge
		Router: rt,
	}
	_ = srv // serve with srv.ServeAgents, srv.ServeHTTPListener, ...
}
