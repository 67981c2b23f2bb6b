package testnet

import (
	"context"
	"net"
	"net/http"
	"testing"
)

// Listen returns a listener on a free loopback port; the caller closes it.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// ServeHTTP runs h as an app on loopback until the test ends, speaking
// HTTP/1.1, and with h2c HTTP/2 with prior knowledge too, and returns its
// address.
func ServeHTTP(t testing.TB, h http.Handler, h2c bool) string {
	t.Helper()
	ln := Listen(t)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(h2c)
	srv := &http.Server{Handler: h, Protocols: &p}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

// HTTPClient returns an HTTP client whose every connection goes to addr,
// whatever the URL's host: an HTTP/1.1 one, or with h2c one speaking
// HTTP/2 with prior knowledge. Its idle connections close when the test
// ends.
func HTTPClient(t testing.TB, addr string, h2c bool) *http.Client {
	var p http.Protocols
	if h2c {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		Protocols:           &p,
		DisableCompression:  true,
		MaxIdleConnsPerHost: 64,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
