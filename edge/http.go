package edge

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/forwarded"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// ServeHTTP routes a public HTTP request to the agent that bound its Host:
// the Host minus ".<Domain>", case-insensitive, port ignored. An unknown
// name gets 404, an agent that cannot be reached 502, each with a short
// plain-text body. The request and response stream through (no whole-body
// buffering); Upgrade requests such as WebSocket are passed through.
// X-Forwarded-For, -Proto and -Host get exactly one hop, the client's, and
// the Host header is kept.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	host, err := s.routeHost(r.Host)
	if errors.Is(err, errMalformedHost) {
		plain(w, http.StatusBadRequest, "bad request: malformed Host")
		return
	}
	if err != nil {
		plain(w, http.StatusNotFound, "tunnel not found")
		return
	}
	routes, err := s.router().Lookup(r.Context(), wire.ProtoHTTP, host)
	if err != nil {
		s.log().Warn("router lookup", "host", host, "err", err)
		plain(w, http.StatusServiceUnavailable, "routing unavailable")
		return
	}
	if len(routes) == 0 {
		plain(w, http.StatusNotFound, "tunnel not found: "+host)
		return
	}
	t := &httpTarget{
		routes: routes,
		info:   ConnInfo{Client: clientAddr(r.RemoteAddr), Host: r.Host},
		// One pooled stream per client connection and host: the stream's
		// header names the client, so it must not carry another client's
		// requests. RemoteAddr identifies the client's connection.
		poolKey: "c" + hex.EncodeToString([]byte(r.RemoteAddr)) + "." + host,
	}
	s.proxy.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpTargetKey{}, t)))
}

// routeHost returns the normalised host name of a Host header that lies
// under the server's domain, errMalformedHost for a Host that is no host
// name at all, and errOtherHost for one that names no tunnel (an IP literal,
// a name outside the domain, the domain itself).
func (s *Server) routeHost(hostport string) (string, error) {
	h := hostport
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", errMalformedHost
		}
		if _, err := netip.ParseAddr(h[1:end]); err != nil {
			return "", errMalformedHost
		}
		return "", errOtherHost
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		port := h[i+1:]
		for j := 0; j < len(port); j++ {
			if port[j] < '0' || port[j] > '9' {
				return "", errMalformedHost
			}
		}
		h = h[:i]
	}
	h, ok := router.Normalise(h)
	if !ok {
		return "", errMalformedHost
	}
	domain, ok := router.Normalise(s.Domain)
	if !ok || !strings.HasSuffix(h, "."+domain) {
		return "", errOtherHost
	}
	return h, nil
}

var (
	errMalformedHost = errors.New("edge: malformed host")
	errOtherHost     = errors.New("edge: host names no tunnel")
)

func (s *Server) responseHeaderTimeout() time.Duration {
	switch {
	case s.ResponseHeaderTimeout < 0:
		return 0
	case s.ResponseHeaderTimeout == 0:
		return 5 * time.Minute
	}
	return s.ResponseHeaderTimeout
}

// clientAddr parses an http.Request's RemoteAddr.
func clientAddr(remote string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func plain(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write([]byte(msg + "\n"))
}

type httpTargetKey struct{}

// httpTarget travels in a proxied request's context to the transport's dial.
type httpTarget struct {
	routes  []Route
	info    ConnInfo
	poolKey string
}

// httpProxy is the reverse proxy of a Server's public HTTP traffic.
type httpProxy struct {
	srv       *Server
	rp        *httputil.ReverseProxy
	transport *http.Transport
}

func newHTTPProxy(s *Server) *httpProxy {
	p := &httpProxy{srv: s}
	p.transport = &http.Transport{
		DialContext:           p.dial,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		DisableCompression:    true,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: s.responseHeaderTimeout(),
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:      p.rewrite,
		Transport:    p.transport,
		ErrorHandler: p.errorHandler,
		BufferPool:   bufferPool{},
		ErrorLog:     slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
	}
	return p
}

func (p *httpProxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(httpTargetKey{}).(*httpTarget)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = t.poolKey
	proto := "http"
	if pr.In.TLS != nil {
		proto = "https"
	}
	forwarded.Rewrite(pr, forwarded.Hop{For: t.info.Client, Proto: proto, Host: pr.In.Host})
}

func (p *httpProxy) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	t, _ := ctx.Value(httpTargetKey{}).(*httpTarget)
	if t == nil {
		return nil, errors.New("edge: dial without a route")
	}
	c, _, err := p.srv.dialRoutes(ctx, t.routes, t.info)
	return c, err
}

func (p *httpProxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The client went away; nobody reads an answer.
		return
	}
	p.srv.log().Info("proxy", "host", r.Host, "err", err)
	plain(w, http.StatusBadGateway, "tunnel unreachable")
}

// bufferPool lends the 32 KiB buffers ReverseProxy copies bodies with.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
