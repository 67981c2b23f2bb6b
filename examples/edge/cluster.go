package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
	etcd, prefix, metrics *string
	ttl                   *time.Duration
}

func (c *cluster) extension() *edgecmd.Extension {
	return &edgecmd.Extension{Flags: c.flags, Configure: c.configure}
}

func (c *cluster) flags(fs *flag.FlagSet) {
	c.etcd = fs.String("etcd", "", "etcd endpoints, comma-separated (http://127.0.0.1:2379): share routes with the other edges using them (needs -relay; empty: routes in memory)")
	c.prefix = fs.String("etcd-prefix", "/tunnelkit/", "etcd key prefix of the cluster's name space")
	c.ttl = fs.Duration("etcd-ttl", 10*time.Second, "lease TTL of this edge's routes in etcd: a dead edge's routes vanish within it")
	c.metrics = fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics (empty: none)")
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
	if *c.etcd != "" {
		if srv.ID == "" {
			done()
			return nil, errors.New("-etcd: the edges of a cluster relay to each other: give -relay (and its certificate flags)")
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*c.etcd, ","), DialTimeout: 5 * time.Second})
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
