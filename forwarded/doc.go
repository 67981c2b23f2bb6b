// Package forwarded tells the application behind a proxy who really asked:
// it adds one hop (client address, scheme, host) to the X-Forwarded-For,
// X-Forwarded-Proto and X-Forwarded-Host headers and, if asked, to the
// RFC 7239 Forwarded header, without losing, doubling or letting a client
// forge the hop.
//
// By default it does what ngrok documents: each X-Forwarded-* header gets
// this hop's value appended, comma-separated, when a value is already there,
// and set otherwise; applications read the last value. Header lines are
// folded into one, empty elements are skipped, and client addresses are
// written the same way everywhere (IPv4-mapped IPv6 unmapped, zones dropped,
// IPv6 unbracketed and without a port). The Host header is preserved.
// [Options] chooses a [Policy] per header (append, replace, keep, strip),
// adds RFC 7239 Forwarded, strips forwarding headers sent by untrusted peers
// and replaces Host for upstreams that expect "localhost:3000".
//
// Typical use, in a proxy built on [httputil.ReverseProxy]:
//
//	proxy := &httputil.ReverseProxy{
//		Rewrite: func(pr *httputil.ProxyRequest) {
//			pr.SetURL(upstream)
//			forwarded.Rewrite(pr, forwarded.HopFromRequest(pr.In))
//		},
//	}
//
// and, when the client address comes from elsewhere (over a tunnel,
// pr.In.RemoteAddr may be the tunnel, not the client):
//
//	hop := forwarded.HopFromRequest(pr.In)
//	hop.For = clientAddr // a netip.AddrPort
//	opts.Rewrite(pr, hop)
//
// A proxy that copies requests itself calls [Append] or [Options.Append]
// on the outbound header set instead, and sets the outbound Host itself
// ([Options.Host] is applied by Rewrite only).
//
// # httputil.ReverseProxy
//
// Use Rewrite, not Director. ReverseProxy deletes the four forwarding headers
// from the outbound request before Rewrite runs; [Options.Rewrite] rebuilds
// them from the inbound request, so exactly one hop is added whatever the
// client sent. Forwarding headers that the client lists in its Connection
// header are hop-by-hop by RFC 9110: they are addressed to this proxy only,
// so their values are treated as absent (a client sending
// "Connection: X-Forwarded-For" gets no prior X-Forwarded-For, and still
// exactly one hop).
//
// With a Director there is no correct way: after the Director returns,
// ReverseProxy appends In.RemoteAddr to X-Forwarded-For itself, so appending
// in the Director reports the client twice, and setting X-Forwarded-For to
// nil (the documented way to stop ReverseProxy) sends no X-Forwarded-For at
// all. ReverseProxy also removes the headers named in Connection after the
// Director, which can delete the values it wrote.
//
// # Spoofing
//
// A client can send any X-Forwarded-* value. With [PolicyAppend] the last
// value is always this proxy's, so an application that reads the last value
// is safe; one that reads the first (Express does, for X-Forwarded-Proto and
// X-Forwarded-Host) needs [PolicyReplace], or [Options.TrustedPeers] so that
// only known proxies' values are kept. When a hop value is unknown (an
// invalid address, an empty or malformed scheme or host) the header is
// removed rather than left ending in a value the client chose.
package forwarded
