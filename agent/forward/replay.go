package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// replay sends r to the app as a request from the edge, over a conn of its
// own that forwardConn serves like any other (recorded, and logged), and
// discards the response, which the Recorder has seen: the replay func of
// Recorder.Record. It returns once that conn's exchange has ended, and
// its recording with it; it ends early when r's context is done, or when
// Serve returns.
func (p *httpProxy) replay(r *http.Request) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	client, conn := net.Pipe()
	served := make(chan struct{})
	o := origin{client: r.RemoteAddr, ctx: r.Context(), replay: true}
	if !p.serve(conn, func() { defer close(served); p.forwardConn(conn, o) }) {
		client.Close()
		conn.Close()
		return p.stopped()
	}
	defer func() {
		client.Close()
		<-served
	}()

	var protos http.Protocols
	if p.h2c {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	var dialed atomic.Bool
	t := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if dialed.Swap(true) {
				return nil, errors.New("forward: a replay has one connection")
			}
			return client, nil
		},
		Protocols: &protos,
		// The app gets the replayed request's own Accept-Encoding, if it
		// has one, and no other.
		DisableCompression: true,
	}
	defer t.CloseIdleConnections()
	out := r.Clone(ctx)
	out.URL.Scheme, out.URL.Host = "http", p.to
	out.RequestURI = ""
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = nil // none, rather than Go's
	}
	resp, err := t.RoundTrip(out)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		if p.isClosed() {
			return p.stopped()
		}
		return fmt.Errorf("forward: the response broke off: %w", err)
	}
	return nil
}

// stopped is the error of a replay once Serve has returned.
func (p *httpProxy) stopped() error {
	return fmt.Errorf("forward: the forwarder to %s has stopped: %w", p.to, http.ErrServerClosed)
}
