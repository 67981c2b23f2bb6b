package forwarded

import (
	"net/http"
	"net/http/httputil"
	"net/netip"
)

// HopFromRequest returns the hop of a request received by this proxy, as
// httputil.ProxyRequest.SetXForwarded sees it: For is r.RemoteAddr ("ip:port",
// or a bare IP; anything else leaves For unknown), Proto is "https" if r
// came over TLS and "http" otherwise, and Host is r.Host.
//
// Over a tunnel, or behind a load balancer, r.RemoteAddr may not be the
// client: set For from what the tunnel says.
func HopFromRequest(r *http.Request) Hop {
	hop := Hop{Proto: "http", Host: r.Host}
	if r.TLS != nil {
		hop.Proto = "https"
	}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		hop.For = ap
	} else if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		hop.For = netip.AddrPortFrom(a, 0)
	}
	return hop
}

// Rewrite adds hop to pr.Out with the default, ngrok-compatible options;
// see [Options.Rewrite].
func Rewrite(pr *httputil.ProxyRequest, hop Hop) {
	(*Options)(nil).Rewrite(pr, hop)
}

// Rewrite is a step of an [httputil.ReverseProxy] Rewrite function: it sets
// the forwarding headers of pr.Out from those of pr.In with hop added, as
// [Options.Append] would on pr.In's headers, so that exactly one hop is
// added whatever the client sent; forwarding headers already on pr.Out are
// replaced. pr.In is not modified. A nil *Options means the defaults.
//
// It also sets pr.Out.Host: to o.Host if not empty, and to pr.In.Host
// otherwise. Call it after [httputil.ProxyRequest.SetURL], which clears
// pr.Out.Host.
func (o *Options) Rewrite(pr *httputil.ProxyRequest, hop Hop) {
	if pr.Out.Header == nil {
		pr.Out.Header = make(http.Header)
	}
	o.apply(pr.Out.Header, pr.In.Header, false, hop)
	if o != nil && o.Host != "" {
		pr.Out.Host = o.Host
	} else {
		pr.Out.Host = pr.In.Host
	}
}
