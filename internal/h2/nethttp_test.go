package h2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// proxy copies the connections it accepts to a server, byte for byte,
// observing each with a Conn.
type proxy struct {
	ln     net.Listener
	server string
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{}       // closed and replaced when got or errs change
	got     map[string]Exchange // by target
	errs    []error
	reqs    []*bytes.Buffer // the bytes of each connection, if record
	resps   []*bytes.Buffer
	record  bool
	open    int          // connections being served
	stop    func() error // closes the server
}

func newProxy(t testing.TB, server string, record bool) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, server: server, changed: make(chan struct{}), got: map[string]Exchange{}, record: record}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
		if len(p.errs) > 0 {
			t.Errorf("observing stopped: %v", p.errs)
		}
	})
	return p
}

// finish closes the server, waits until the proxy has served all its
// connections, and returns the bytes it recorded.
func (p *proxy) finish(t testing.TB) (reqs, resps []*bytes.Buffer) {
	t.Helper()
	p.stop()
	timeout := time.After(10 * time.Second)
	for {
		p.mu.Lock()
		open, changed := p.open, p.changed
		reqs, resps = p.reqs, p.resps
		p.mu.Unlock()
		if open == 0 {
			return reqs, resps
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatal("the client's connections did not end")
		}
	}
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.open++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *proxy) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	server, err := net.Dial("tcp", p.server)
	if err != nil {
		return
	}
	defer server.Close()
	var reqs, resps bytes.Buffer
	obs := &Conn{Done: func(x Exchange) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.got[x.Target] = x
		p.notify()
	}}
	done := make(chan struct{})
	go func() { // client to server
		defer close(done)
		copyObserved(server, client, obs.Request, &reqs, p.record)
		server.(*net.TCPConn).CloseWrite()
	}()
	copyObserved(client, server, obs.Response, &resps, p.record)
	obs.ResponseEOF()
	client.Close()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := obs.Err(); err != nil {
		p.errs = append(p.errs, err)
	}
	if p.record {
		p.reqs, p.resps = append(p.reqs, &reqs), append(p.resps, &resps)
	}
	p.open--
	p.notify()
}

// copyObserved copies src to dst, calling observe before each write.
func copyObserved(dst, src net.Conn, observe func([]byte), rec *bytes.Buffer, record bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		observe(buf[:n])
		if record {
			rec.Write(buf[:n])
		}
		if _, werr := dst.Write(buf[:n]); werr != nil || err != nil {
			return
		}
	}
}

// wait returns the exchange for target, once it is reported.
func (p *proxy) wait(t testing.TB, target string) Exchange {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		p.mu.Lock()
		x, ok := p.got[target]
		errs, changed := p.errs, p.changed
		p.mu.Unlock()
		if ok {
			return x
		}
		if len(errs) > 0 {
			t.Fatalf("waiting for %s: observing stopped: %v", target, errs)
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no exchange for %s", target)
		}
	}
}

// h2c starts an h2c server with handler and a proxy to it, and returns a
// client whose connections go through the proxy, and the proxy's URL.
func h2c(t testing.TB, handler http.Handler, record bool) (*http.Client, string, *proxy) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	p := newProxy(t, ln.Addr().String(), record)
	p.stop = srv.Close
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(func() { tr.CloseIdleConnections(); srv.Close() }) // before the proxy's cleanup
	return &http.Client{Transport: tr}, "http://" + p.ln.Addr().String(), p
}

// handler serves the paths the tests request.
func handler(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/empty":
	case path == "/small":
		io.WriteString(w, "hello, world")
	case path == "/big":
		w.Write(bytes.Repeat([]byte("b"), 1<<20))
	case path == "/404":
		http.Error(w, "not here", http.StatusNotFound)
	case path == "/echo":
		io.Copy(w, r.Body)
	case path == "/trailers":
		w.Header().Set("Trailer", "X-Checksum")
		io.WriteString(w, "body before trailers")
		w.Header().Set("X-Checksum", "abc")
	case path == "/cancel":
		w.Write(make([]byte, 64<<10))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case strings.HasPrefix(path, "/grpc.Service/"):
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/grpc")
		if strings.HasSuffix(path, "/Fail") {
			// Trailers-only: one HEADERS frame that ends the stream.
			w.Header().Set("Grpc-Status", "5")
			w.Header().Set("Grpc-Message", "not found")
			return
		}
		w.Write([]byte{0, 0, 0, 0, 3, 'a', 'b', 'c'})
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	default:
		http.NotFound(w, r)
	}
}

// do sends a request and returns the response, its body's length, and
// the exchange the proxy reported for it.
func do(t *testing.T, c *http.Client, p *proxy, method, url string, body io.Reader, hdr ...string) (*http.Response, int64, Exchange) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("%s: %s, not HTTP/2", url, resp.Proto)
	}
	x := p.wait(t, req.URL.RequestURI())
	if x.Method != method || x.Status != resp.StatusCode || x.Bytes != n || x.Reset || x.Start.IsZero() {
		t.Errorf("%s %s: got %+v; the client saw %d with %d bytes", method, url, x, resp.StatusCode, n)
	}
	return resp, n, x
}

// TestNetHTTP checks the exchanges a Conn reports against what a Go HTTP/2
// client saw, through a proxy between it and a Go h2c server.
func TestNetHTTP(t *testing.T) {
	c, url, p := h2c(t, http.HandlerFunc(handler), false)
	t.Run("bodies", func(t *testing.T) {
		for _, path := range []string{"/empty", "/small", "/big", "/404", "/nowhere?q=1"} {
			do(t, c, p, "GET", url+path, nil)
		}
		do(t, c, p, "HEAD", url+"/big?head", nil)
		do(t, c, p, "POST", url+"/echo?small", strings.NewReader("ping"))
		do(t, c, p, "POST", url+"/echo?big", bytes.NewReader(make([]byte, 1<<20)))
		do(t, c, p, "PUT", url+"/echo?empty", http.NoBody)
	})
	t.Run("trailers", func(t *testing.T) {
		resp, n, _ := do(t, c, p, "GET", url+"/trailers", nil)
		if resp.Trailer.Get("X-Checksum") != "abc" || n != int64(len("body before trailers")) {
			t.Errorf("trailers %v, %d bytes", resp.Trailer, n)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				path := fmt.Sprintf("/small?i=%d", i)
				if i%4 == 0 {
					path = fmt.Sprintf("/big?i=%d", i)
				}
				do(t, c, p, "GET", url+path, nil)
			})
		}
		wg.Wait()
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/cancel", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		cancel()
		if _, err := io.Copy(io.Discard, resp.Body); !errors.Is(err, context.Canceled) {
			t.Fatalf("reading after cancel: %v", err)
		}
		x := p.wait(t, "/cancel")
		if x.Method != "GET" || x.Status != 200 || !x.Reset || x.Bytes < 1000 || x.Bytes > 64<<10 {
			t.Errorf("got %+v, want a reset GET with 200", x)
		}
	})
	p.finish(t)
}

// TestGRPC checks a gRPC-like exchange with trailers, and a trailers-only
// error response: one HEADERS frame with :status and grpc-status that ends
// the stream.
func TestGRPC(t *testing.T) {
	c, url, p := h2c(t, http.HandlerFunc(handler), true)
	grpc := []string{"Content-Type", "application/grpc", "Te", "trailers"}
	msg := []byte{0, 0, 0, 0, 2, 'h', 'i'}
	resp, n, _ := do(t, c, p, "POST", url+"/grpc.Service/Get", bytes.NewReader(msg), grpc...)
	if resp.Trailer.Get("Grpc-Status") != "0" || n != 8 {
		t.Errorf("trailers %v, %d bytes", resp.Trailer, n)
	}
	resp, n, _ = do(t, c, p, "POST", url+"/grpc.Service/Fail", bytes.NewReader(msg), grpc...)
	if resp.Header.Get("Grpc-Status") != "5" || len(resp.Trailer) != 0 || n != 0 || resp.StatusCode != 200 {
		t.Errorf("trailers-only response: header %v, trailers %v, %d bytes", resp.Header, resp.Trailer, n)
	}

	// Check that the server sent the error as trailers-only.
	_, resps := p.finish(t)
	found := false
	for _, b := range resps {
		fr := http2.NewFramer(nil, b)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				break
			}
			if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamEnded() && h.PseudoValue("status") == "200" {
				found = found || slices.ContainsFunc(h.RegularFields(), func(f hpack.HeaderField) bool { return f.Name == "grpc-status" && f.Value == "5" })
			}
		}
	}
	if !found {
		t.Error("no trailers-only response in the server's frames")
	}
}
