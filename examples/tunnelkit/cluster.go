package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"
	"github.com/tunnelkit/tunnelkit/metrics"
	"github.com/tunnelkit/tunnelkit/router/etcdrouter"
)

// cluster adds routes shared through etcd and Prometheus metrics to the
// edge command.
type cluster struct {
	etcd, prefix, metrics     *string
	pprof                     *string
	etcdCert, etcdKey, etcdCA *string
	ttl                       *time.Duration
}

func (c *cluster) extension() *edgecmd.Extension {
	return &edgecmd.Extension{Flags: c.flags, Configure: c.configure}
}

func (c *cluster) flags(fs *flag.FlagSet) {
	c.etcd = fs.String("etcd", "", "etcd endpoints, comma-separated (https://127.0.0.1:2379): share routes with the other edges using them (needs -relay; empty: routes in memory). Whoever can write to etcd decides where names go and which edges may relay: use https:// with -etcd-cert")
	c.etcdCert = fs.String("etcd-cert", "", "PEM client certificate of this edge for etcd, which etcd checks (--client-cert-auth) (with -etcd-key; needs https:// endpoints)")
	c.etcdKey = fs.String("etcd-key", "", "PEM private key of -etcd-cert")
	c.etcdCA = fs.String("etcd-ca", "", "PEM file of the CA that signs etcd's server certificate (empty: the system's roots)")
	c.prefix = fs.String("etcd-prefix", "/tunnelkit/", "etcd key prefix of the cluster's name space")
	c.ttl = fs.Duration("etcd-ttl", etcdrouter.DefaultTTL, "lease TTL of this edge's routes in etcd: a dead edge's routes vanish within it; an etcd slower than it to renew (an overloaded one) takes every route of the edge with it")
	c.metrics = fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics (empty: none)")
	c.pprof = fs.String("pprof", "", "serve Go's runtime profiles (package net/http/pprof: heap, goroutines, CPU) at http://ADDR/debug/pprof/ (empty: none); they show what the process holds and take CPU while they run: keep ADDR on loopback")
}

func (c *cluster) configure(ctx context.Context, srv *edge.Server, log *slog.Logger) (func(), error) {
	var release []func()
	done := func() {
		for i := len(release) - 1; i >= 0; i-- {
			release[i]()
		}
	}
	if *c.metrics != "" {
		m := metrics.NewEdge()
		reg := prometheus.NewRegistry()
		reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		ln, err := net.Listen("tcp", *c.metrics)
		if err != nil {
			return nil, fmt.Errorf("-metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		release = append(release, func() { hs.Close() })
		srv.Observer = m
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	}
	if *c.pprof != "" {
		ln, err := net.Listen("tcp", *c.pprof)
		if err != nil {
			done()
			return nil, fmt.Errorf("-pprof: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		release = append(release, func() { hs.Close() })
		log.Info("profiles", "url", "http://"+ln.Addr().String()+"/debug/pprof/")
	}
	if *c.etcd != "" {
		if srv.ID == "" {
			done()
			return nil, errors.New("-etcd: the edges of a cluster relay to each other: give -relay (and its certificate flags)")
		}
		endpoints := strings.Split(*c.etcd, ",")
		tlsConfig, err := c.etcdTLS(endpoints)
		if err != nil {
			done()
			return nil, err
		}
		if tlsConfig == nil {
			log.Warn("etcd without TLS: whoever reaches it can take names and make edges members of the cluster; use https:// endpoints and -etcd-cert", "endpoints", *c.etcd)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tlsConfig, DialTimeout: 5 * time.Second})
		if err != nil {
			done()
			return nil, fmt.Errorf("-etcd: %w", err)
		}
		setup, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		rt, err := etcdrouter.New(setup, etcdrouter.Config{Client: cli, Prefix: *c.prefix, Edge: srv.ID, TTL: *c.ttl, Logger: log.With("router", "etcd")})
		if err != nil {
			cli.Close()
			done()
			return nil, fmt.Errorf("-etcd: %w", err)
		}
		release = append(release, func() { rt.Close(); cli.Close() })
		srv.Router = rt
		log.Info("routes shared through etcd", "endpoints", *c.etcd, "prefix", *c.prefix, "edge", srv.ID)
	}
	return done, nil
}

// etcdTLS returns the TLS configuration of the etcd client: nil for
// http:// endpoints, which may not be mixed with https:// ones or given
// -etcd-cert, -etcd-key or -etcd-ca.
func (c *cluster) etcdTLS(endpoints []string) (*tls.Config, error) {
	var secure int
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, "https://") {
			secure++
		}
	}
	flags := *c.etcdCert != "" || *c.etcdKey != "" || *c.etcdCA != ""
	switch {
	case (*c.etcdCert == "") != (*c.etcdKey == ""):
		return nil, errors.New("-etcd-cert and -etcd-key go together")
	case secure == 0 && !flags:
		return nil, nil
	case secure < len(endpoints):
		return nil, fmt.Errorf("-etcd %s: with TLS (https:// or -etcd-cert, -etcd-key, -etcd-ca), every endpoint must be https://", *c.etcd)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if *c.etcdCert != "" {
		cert, err := tls.LoadX509KeyPair(*c.etcdCert, *c.etcdKey)
		if err != nil {
			return nil, fmt.Errorf("-etcd-cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if *c.etcdCA != "" {
		pem, err := os.ReadFile(*c.etcdCA)
		if err != nil {
			return nil, fmt.Errorf("-etcd-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-etcd-ca %s: no PEM certificate", *c.etcdCA)
		}
	}
	return cfg, nil
}
