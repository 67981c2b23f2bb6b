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
	changed chan struct{}          // closed and replaced when got or errs change
	got     map[string]Exchange    // by target
	msgs    map[string]*streamMsgs // by target: what Header and Data passed
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
	p := &proxy{ln: ln, server: server, changed: make(chan struct{}), got: map[string]Exchange{}, msgs: map[string]*streamMsgs{}, record: record}
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
	var smu sync.Mutex
	streams := map[uint32]*streamMsgs{}
	msgsOf := func(id uint32) *streamMsgs {
		if streams[id] == nil {
			streams[id] = new(streamMsgs)
		}
		return streams[id]
	}
	obs := &Conn{Done: func(x Exchange) {
		smu.Lock()
		m := streams[x.Stream]
		delete(streams, x.Stream)
		smu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.got[x.Target] = x
		p.msgs[x.Target] = m
		p.notify()
	}, Header: func(id uint32, response bool, fields []hpack.HeaderField, end bool) {
		smu.Lock()
		defer smu.Unlock()
		m := msgsOf(id)
		m.blocks = append(m.blocks, block{response, slices.Clone(fields), end})
	}, Data: func(id uint32, response bool, p []byte) {
		smu.Lock()
		defer smu.Unlock()
		m := msgsOf(id)
		if response {
			m.resp = append(m.resp, p...)
		} else {
			m.req = append(m.req, p...)
		}
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

// streamMsgs is what a Conn's Header and Data passed of one stream.
type streamMsgs struct {
	blocks    []block
	req, resp []byte
}

// block is a header block Header passed.
type block struct {
	response bool
	fields   []hpack.HeaderField
	end      bool
}

// value returns the value of the field name in the first block of the
// direction response.
func (m *streamMsgs) value(response bool, name string) string {
	for _, b := range m.blocks {
		if b.response == response {
			for _, f := range b.fields {
				if f.Name == name {
					return f.Value
				}
			}
			return ""
		}
	}
	return ""
}

// wait returns the exchange for target, once it is reported.
func (p *proxy) wait(t testing.TB, target string) Exchange {
	t.Helper()
	x, _ := p.waitMsgs(t, target)
	return x
}

// waitMsgs returns the exchange for target, once it is reported, and what
// Header and Data passed of it.
func (p *proxy) waitMsgs(t testing.TB, target string) (Exchange, *streamMsgs) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		p.mu.Lock()
		x, ok := p.got[target]
		m := p.msgs[target]
		errs, changed := p.errs, p.changed
		p.mu.Unlock()
		if ok {
			if m == nil {
				m = new(streamMsgs)
			}
			return x, m
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
// the exchange the proxy reported for it. It checks that the headers and
// bodies that Header and Data passed are those the client sent and got.
func do(t *testing.T, c *http.Client, p *proxy, method, url string, body io.Reader, hdr ...string) (*http.Response, int64, Exchange) {
	t.Helper()
	var sent bytes.Buffer
	if body != nil && body != http.NoBody {
		body = io.TeeReader(body, &sent)
	}
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
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(got))
	if resp.ProtoMajor != 2 {
		t.Fatalf("%s: %s, not HTTP/2", url, resp.Proto)
	}
	x, m := p.waitMsgs(t, req.URL.RequestURI())
	if x.Method != method || x.Status != resp.StatusCode || x.Bytes != n || x.Reset || x.Start.IsZero() || x.Stream%2 != 1 {
		t.Errorf("%s %s: got %+v; the client saw %d with %d bytes", method, url, x, resp.StatusCode, n)
	}
	if !bytes.Equal(m.req, sent.Bytes()) || !bytes.Equal(m.resp, got) {
		t.Errorf("%s %s: Data passed %d bytes of request body and %d of response body; the client sent %d and got %d", method, url, len(m.req), len(m.resp), sent.Len(), len(got))
	}
	if m.value(false, ":method") != method || m.value(false, ":path") != req.URL.RequestURI() || m.value(true, ":status") != fmt.Sprint(resp.StatusCode) {
		t.Errorf("%s %s: Header passed %v", method, url, m.blocks)
	}
	if len(m.blocks) == 0 || m.blocks[0].response || m.blocks[0].end != (sent.Len() == 0 && (body == nil || body == http.NoBody)) {
		t.Errorf("%s %s: Header passed %v; the request's block ends the stream only without a body", method, url, m.blocks)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if v := m.value(false, strings.ToLower(hdr[i])); v != hdr[i+1] {
			t.Errorf("%s %s: Header passed %s: %q, the client sent %q", method, url, hdr[i], v, hdr[i+1])
		}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" && m.value(true, "content-type") != ct {
		t.Errorf("%s %s: Header passed content-type %q, the client got %q", method, url, m.value(true, "content-type"), ct)
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
		// Header passed the trailers too: a second response block.
		_, m := p.waitMsgs(t, "/trailers")
		var blocks []block
		for _, b := range m.blocks {
			if b.response {
				blocks = append(blocks, b)
			}
		}
		if len(blocks) != 2 || !slices.Contains(blocks[1].fields, hpack.HeaderField{Name: "x-checksum", Value: "abc"}) {
			t.Errorf("response blocks %v; want the header and the trailers, X-Checksum: abc", blocks)
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
