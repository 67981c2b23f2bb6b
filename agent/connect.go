package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// maxConnectAnswer bounds the header of a proxy's answer to CONNECT.
const maxConnectAnswer = 64 << 10

// proxyTLSConfig returns the TLS configuration to an https proxy whose URL
// names host, or nil for an http proxy (host empty).
func (c *Client) proxyTLSConfig(host string) *tls.Config {
	if host == "" {
		return nil
	}
	cfg := &tls.Config{}
	if c.ProxyTLSConfig != nil {
		cfg = c.ProxyTLSConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	return cfg
}

// connect opens a tunnel to the edge through an HTTP proxy with CONNECT,
// over TLS to the proxy when tlsCfg is set (an https proxy), with Basic
// credentials when the URL has a user. ctx bounds it all.
func (p *proxyDial) connect(ctx context.Context, tlsCfg *tls.Config) (net.Conn, error) {
	conn, err := p.dial(ctx, "tcp", p.hostport)
	if err != nil {
		return nil, p.unreachable(ctx, "cannot connect to it", err)
	}
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	if tlsCfg != nil {
		tc := tls.Client(wire.BatchWrites(conn), tlsCfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, p.fail(ctx, "TLS to the proxy", err)
		}
		conn = tc
	}
	// Reads and writes end when ctx does.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: p.edge},
		Host:   p.edge,
		Header: http.Header{"User-Agent": {"tunnelkit-agent"}},
	}
	if p.user != nil {
		pw, _ := p.user.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(p.user.Username() + ":" + pw))
		req.Header.Set("Proxy-Authorization", "Basic "+cred)
	}
	if err := req.Write(conn); err != nil {
		if closedEarly(err) {
			return nil, p.fail(ctx, "closed the connection before answering CONNECT "+p.edge, err)
		}
		return nil, p.fail(ctx, "sending CONNECT "+p.edge, err)
	}
	limit := &io.LimitedReader{R: conn, N: maxConnectAnswer}
	first := &firstBytes{r: limit}
	br := bufio.NewReader(first)
	resp, err := http.ReadResponse(br, req)
	switch {
	case err != nil && limit.N == 0:
		return nil, p.fail(ctx, fmt.Sprintf("answered CONNECT %s with a header of more than %d KiB", p.edge, maxConnectAnswer>>10), nil)
	case err != nil && closedEarly(err):
		return nil, p.fail(ctx, "closed the connection before answering CONNECT "+p.edge, err)
	case err != nil:
		return nil, p.fail(ctx, fmt.Sprintf("answered CONNECT %s with something other than HTTP: %q", p.edge, first.line()), nil)
	}
	// The proxy's own page is of no use; the answer's body is not read.
	status := wire.Printable(resp.Status, 100)
	// 407 asks for credentials; some proxies (tinyproxy) answer wrong ones
	// with 401.
	auth := resp.StatusCode == http.StatusProxyAuthRequired || resp.StatusCode == http.StatusUnauthorized
	switch {
	case auth && p.user == nil:
		return nil, p.fail(ctx, "asks for credentials: it answered CONNECT "+p.edge+" with "+status+" (give them in the proxy URL: scheme://user:password@host:port)", nil)
	case auth:
		return nil, p.fail(ctx, fmt.Sprintf("refused the credentials of the proxy URL's user %q: it answered CONNECT %s with %s", wire.Printable(p.user.Username(), 100), p.edge, status), nil)
	case resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout:
		// The proxy could not reach the edge, as the agent cannot reach
		// an edge that is down.
		return nil, p.unreachable(ctx, "could not reach the edge: it answered CONNECT "+p.edge+" with "+status, nil)
	case resp.StatusCode/100 != 2:
		return nil, p.fail(ctx, "refused the tunnel: it answered CONNECT "+p.edge+" with "+status, nil)
	}
	if !stop() {
		return nil, p.fail(ctx, "no answer in time", nil)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, p.fail(ctx, "after CONNECT "+p.edge, err)
	}
	ok = true
	if n := br.Buffered(); n > 0 {
		// Bytes after the answer's header are the edge's.
		b, _ := br.Peek(n)
		return &prefixConn{Conn: conn, buf: append([]byte(nil), b...)}, nil
	}
	return conn, nil
}

// firstBytes keeps the first bytes read through it, to quote an answer
// that is not HTTP.
type firstBytes struct {
	r   io.Reader
	buf []byte
}

func (f *firstBytes) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if keep := min(n, 100-len(f.buf)); keep > 0 {
		f.buf = append(f.buf, p[:keep]...)
	}
	return n, err
}

// line returns the first line read, printable, cut at 100 bytes.
func (f *firstBytes) line() string {
	line, _, _ := bytes.Cut(f.buf, []byte("\n"))
	return wire.Printable(string(bytes.TrimSuffix(line, []byte("\r"))), 100)
}

// closedEarly reports whether err says the peer closed the connection.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// prefixConn is a conn whose first bytes were read into buf already.
type prefixConn struct {
	net.Conn
	buf []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
