package forward

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// The connections to the app: over TCP or a Unix socket, in plaintext or
// TLS.

// appDialer connects to the app as Bytes and HTTP are told to.
type appDialer struct {
	network string      // "tcp" or "unix"
	to      string      // the address, or the socket's path
	tls     *tls.Config // nil: plaintext
	timeout time.Duration
}

// newAppDialer checks network and returns the dialer of to; alpn, when
// not empty, are the protocols TLS offers unless tlsConfig names its own.
func newAppDialer(network, to string, tlsConfig *tls.Config, timeout time.Duration, alpn ...string) (*appDialer, error) {
	switch network {
	case "":
		network = "tcp"
	case "tcp", "unix":
	default:
		return nil, fmt.Errorf("forward: network %q: want tcp or unix", network)
	}
	d := &appDialer{network: network, to: to, timeout: dialTimeout(timeout)}
	if tlsConfig != nil {
		cfg := tlsConfig.Clone()
		if cfg.ServerName == "" && network == "tcp" {
			// As tls.Dial: the host of the address, a name or an IP
			// address that the app's certificate must carry.
			if host, _, err := net.SplitHostPort(to); err == nil {
				cfg.ServerName = host
			}
		}
		if len(cfg.NextProtos) == 0 {
			cfg.NextProtos = alpn
		}
		d.tls = cfg
	}
	return d, nil
}

// dial connects to the app within ctx and d's timeout, writes what
// before writes (a PROXY protocol header; nil: nothing) and completes TLS
// when d speaks it.
func (d *appDialer) dial(ctx context.Context, before func(net.Conn) error) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, d.network, d.to)
	if err != nil {
		return nil, err
	}
	limitAppBuffers(c)
	if before != nil {
		if err := before(c); err != nil {
			c.Close()
			return nil, fmt.Errorf("PROXY header: %w", err)
		}
	}
	if d.tls == nil {
		return c, nil
	}
	tc := tls.Client(c, d.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS to the app at %s: %w", d.to, err)
	}
	return tc, nil
}

// scheme is the scheme of the app's URL in recordings: https for an app
// that speaks TLS.
func (d *appDialer) scheme() string {
	if d.tls != nil {
		return "https"
	}
	return "http"
}

// urlHost is the host of the app's URL in requests to it: the address,
// or "localhost" for a Unix socket, whose path is no host.
func (d *appDialer) urlHost() string {
	if d.network == "unix" {
		return "localhost"
	}
	return d.to
}
