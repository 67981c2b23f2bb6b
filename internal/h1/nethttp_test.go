package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// oracle reads reqs and resps with net/http, as a server and a client
// would, up to where it finds an error, and returns how many bytes of each
// it read as valid messages and the exchanges they make: what a Conn fed
// those bytes must report. It stops short of where this package knowingly
// differs: a status below 100, which net/http takes and this package does
// not, and more pipelined requests than this package queues. interim
// reports that the responses read end with a 1xx that has no final
// response after it.
func oracle(reqs, resps []byte) (nreq, nresp int, want []got, interim bool) {
	nreq, nresp, want, interim, _ = oracleMessages(reqs, resps)
	return nreq, nresp, want, interim
}

// message is what net/http reads of one message: its head (a request's
// method and request-target, a response's status), its header, and its
// body.
type message struct {
	head   string
	header http.Header
	body   []byte // grown by appends: a string's += made long bodies quadratic
}

func (m message) String() string { return fmt.Sprintf("{%s %v %q}", m.head, m.header, m.body) }

// oracleMessages is oracle, and also returns the messages net/http reads
// that a Conn passes to Head and Body: the requests, then the responses
// (1xx ones too), in order. The requests that follow one that may switch
// protocols are left out until its final answer does not.
func oracleMessages(reqs, resps []byte) (nreq, nresp int, want []got, interim bool, msgs []message) {
	type request struct{ method, target string }
	var rs []request
	var upgrades []bool // of each request: it may switch protocols
	finals := 0         // final responses read
	// passed returns msgs with the requests held left out.
	passed := func() []message {
		n := len(upgrades)
		for i, up := range upgrades {
			if up && i >= finals {
				n = i + 1
				break
			}
		}
		return append(msgs[:n:n], msgs[len(upgrades):]...)
	}
	src := bytes.NewReader(reqs)
	br := bufio.NewReader(src)
	read := func() int { return int(src.Size()) - src.Len() - br.Buffered() }
	for len(rs) < maxQueued {
		req, err := http.ReadRequest(br)
		if err != nil {
			break
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			break
		}
		rs = append(rs, request{req.Method, req.RequestURI})
		_, up := req.Header["Upgrade"]
		upgrades = append(upgrades, up || req.Method == "CONNECT")
		msgs = append(msgs, message{req.Method + " " + req.RequestURI, req.Header, body})
		nreq = read()
	}
	src = bytes.NewReader(resps)
	br = bufio.NewReader(src)
	for len(rs) > 0 {
		resp, err := http.ReadResponse(br, &http.Request{Method: rs[0].method})
		if err != nil {
			break
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode < 100 {
			break
		}
		nresp = read()
		status := resp.StatusCode
		if status == 101 || rs[0].method == "CONNECT" && status/100 == 2 {
			msgs = append(msgs, message{fmt.Sprint(status), resp.Header, nil})
			return nreq, nresp, append(want, got{rs[0].method, rs[0].target, status, 0, true}), false, passed()
		}
		msgs = append(msgs, message{fmt.Sprint(status), resp.Header, body})
		interim = status/100 == 1
		if interim {
			continue
		}
		want = append(want, got{rs[0].method, rs[0].target, status, int64(len(body)), false})
		rs = rs[1:]
		finals++
	}
	return nreq, nresp, want, interim, passed()
}

// heads gathers the messages a Conn passes to Head and Body, read with
// net/http from their heads: the requests first, then the responses.
type heads struct {
	reqs, resps []message
	methods     []string // of the requests whose final response has not passed
	err         error
}

func (h *heads) head(response bool, b []byte) {
	if h.err != nil {
		return
	}
	br := bufio.NewReader(bytes.NewReader(b))
	if !response {
		req, err := http.ReadRequest(br)
		if err != nil || br.Buffered() != 0 {
			h.err = fmt.Errorf("request head %q: %v, %d bytes after it", b, err, br.Buffered())
			return
		}
		h.reqs = append(h.reqs, message{req.Method + " " + req.RequestURI, req.Header, nil})
		h.methods = append(h.methods, req.Method)
		return
	}
	if len(h.methods) == 0 {
		h.err = fmt.Errorf("response head %q without a request", b)
		return
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: h.methods[0]})
	if err != nil || br.Buffered() != 0 {
		h.err = fmt.Errorf("response head %q: %v, %d bytes after it", b, err, br.Buffered())
		return
	}
	if resp.StatusCode/100 != 1 {
		h.methods = h.methods[1:]
	}
	h.resps = append(h.resps, message{fmt.Sprint(resp.StatusCode), resp.Header, nil})
}

func (h *heads) body(response bool, p []byte) {
	l := h.reqs
	if response {
		l = h.resps
	}
	if len(l) == 0 {
		h.err = fmt.Errorf("body bytes %q before any head", p)
		return
	}
	l[len(l)-1].body = append(l[len(l)-1].body, p...)
}

// check feeds reqs and then resps to a Conn at the splits r makes, ends
// with ResponseEOF, and checks that nothing panics. Then it does the same
// with the parts of reqs and resps that net/http reads as valid messages,
// and compares what the Conn reports with what net/http reads.
func check(t *testing.T, r *rand.Rand, reqs, resps []byte) {
	t.Helper()
	s := splitters[r.IntN(len(splitters))]
	nreq, nresp, want, interim := oracle(reqs, resps)
	if nreq < len(reqs) || nresp < len(resps) {
		var c Conn
		observe(r, s, string(reqs), c.Request)
		observe(r, s, string(resps), c.Response)
		c.ResponseEOF()
		c.Waiting()
		reqs, resps = reqs[:nreq], resps[:nresp]
	}
	var exchanges []got
	var hs heads
	c := &Conn{Done: func(x Exchange) {
		exchanges = append(exchanges, got{x.Method, x.Target, x.Status, bodyBytes(x), x.Upgraded})
	}, Head: hs.head, Body: hs.body}
	observe(r, s, string(reqs), c.Request)
	observe(r, s, string(resps), c.Response)
	c.ResponseEOF()
	if err := c.Err(); err != nil && !(interim && errors.Is(err, ErrTruncated)) {
		t.Fatalf("net/http reads the messages, but Err() = %v\nrequests:  %.300q\nresponses: %.300q", err, reqs, resps)
	}
	if fmt.Sprint(exchanges) != fmt.Sprint(want) {
		t.Fatalf("exchanges differ from net/http's\n got %v\nwant %v\nrequests:  %.300q\nresponses: %.300q", exchanges, want, reqs, resps)
	}
	// The heads and bodies passed are the messages net/http reads.
	_, _, _, _, msgs := oracleMessages(reqs, resps)
	if hs.err != nil {
		t.Fatalf("%v\nrequests:  %.300q\nresponses: %.300q", hs.err, reqs, resps)
	}
	if got := append(hs.reqs, hs.resps...); fmt.Sprint(got) != fmt.Sprint(msgs) {
		t.Fatalf("heads and bodies differ from net/http's\n got %.2000v\nwant %.2000v\nrequests:  %.300q\nresponses: %.300q", got, msgs, reqs, resps)
	}
}

// generate writes a random sequence of requests and their responses with
// net/http itself.
func generate(r *rand.Rand) (reqs, resps []byte) {
	var rq, rp bytes.Buffer
	n := 1 + r.IntN(5)
	for i := range n {
		last := i == n-1
		method := []string{"GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS"}[r.IntN(6)]
		req, _ := http.NewRequest(method, fmt.Sprintf("http://example.com/%d?q=%d", i, r.IntN(100)), nil)
		body := strings.Repeat("b", r.IntN(3000))
		switch r.IntN(4) {
		case 1: // Content-Length
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
		case 2: // chunked
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(body)), -1
			req.TransferEncoding = []string{"chunked"}
		case 3: // chunked with trailers
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(body)), -1
			req.TransferEncoding = []string{"chunked"}
			req.Trailer = http.Header{"X-Checksum": {"abc"}, "X-Other": {"1", "2"}}
		}
		if err := req.Write(&rq); err != nil {
			panic(err)
		}

		for range r.IntN(3) {
			fmt.Fprintf(&rp, "HTTP/1.1 %d Interim\r\nLink: </s.css>; rel=preload\r\n\r\n", []int{100, 102, 103}[r.IntN(3)])
		}
		status := []int{200, 201, 204, 206, 301, 304, 404, 500}[r.IntN(8)]
		resp := &http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: 1, Request: req, Header: http.Header{"Content-Type": {"text/plain"}}}
		body = strings.Repeat("r", r.IntN(5000))
		switch k := r.IntN(4); {
		case status == 204 || status == 304 || method == "HEAD": // no body
		case k == 0 || k == 3 && !last: // Content-Length
			resp.Body, resp.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
		case k == 1: // chunked
			resp.Body, resp.ContentLength = io.NopCloser(strings.NewReader(body)), -1
			resp.TransferEncoding = []string{"chunked"}
		case k == 2: // chunked with trailers
			resp.Body, resp.ContentLength = io.NopCloser(strings.NewReader(body)), -1
			resp.TransferEncoding = []string{"chunked"}
			resp.Trailer = http.Header{"X-Checksum": {"abc"}}
		default: // until the server closes
			resp.Body, resp.ContentLength = io.NopCloser(strings.NewReader(body)), -1
			resp.Close = true
		}
		if err := resp.Write(&rp); err != nil {
			panic(err)
		}
	}
	return rq.Bytes(), rp.Bytes()
}

// TestNetHTTP checks the exchanges a Conn reports against what net/http
// reads from the same bytes, for messages net/http wrote.
func TestNetHTTP(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	n := 500
	if testtools.RaceEnabled {
		n = 50 // the first 50; .ci/run runs the 500 without the race detector
	}
	for i := range n {
		reqs, resps := generate(r)
		if nreq, nresp, _, _ := oracle(reqs, resps); nreq < len(reqs) || nresp < len(resps) {
			t.Fatalf("sequence %d: net/http does not read what it wrote\nrequests:  %.300q\nresponses: %.300q", i, reqs, resps)
		}
		check(t, r, reqs, resps)
	}
}

// seeds are request and response sequences for the fuzz targets.
func seeds() [][2]string {
	r := rand.New(rand.NewPCG(7, 8))
	s := [][2]string{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nHello, world!"},
		{"HEAD / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\n"},
		{"POST / HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"},
		{"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n\x81\x00", "HTTP/1.1 101 Switching Protocols\r\n\r\n\x82\x00"},
		{"GET / HTTP/1.1\r\nUpgrade: h2c\r\n\r\nGET /2 HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.0 200 OK\r\n\r\nuntil EOF"},
		{"CONNECT h:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\n\r\n\x16\x03"},
		{"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length:\r\n 5\r\n\r\nhello"},
		// Hostile paths, as routing by path prefix meets them: dot
		// segments (plain and escaped), empty segments, an escaped
		// slash, case, a query that looks like a path, an absolute form.
		{"GET /api/../admin HTTP/1.1\r\nHost: x\r\n\r\nGET //api HTTP/1.1\r\n\r\nGET /api%2Fx HTTP/1.1\r\n\r\nGET /api/%2e%2e/%2E%2e/etc HTTP/1.1\r\n\r\n",
			"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"},
		{"GET /API/./x/..;/y?next=/api/v2#f HTTP/1.1\r\n\r\nGET http://h/api/v2/..%2f..%2fadmin HTTP/1.1\r\n\r\nGET /%61pi/caf\xc3\xa9/a b HTTP/1.1\r\n\r\n",
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n"},
	}
	for range 8 {
		reqs, resps := generate(r)
		if len(reqs)+len(resps) < 4000 {
			s = append(s, [2]string{string(reqs), string(resps)})
		}
	}
	return s
}

// FuzzConn feeds arbitrary request and response bytes at arbitrary splits:
// nothing may panic, and for the parts net/http reads as valid messages
// the Conn must report what it reads.
func FuzzConn(f *testing.F) {
	for i, s := range seeds() {
		f.Add([]byte(s[0]), []byte(s[1]), uint64(i))
	}
	f.Fuzz(func(t *testing.T, reqs, resps []byte, seed uint64) {
		check(t, rand.New(rand.NewPCG(seed, seed)), reqs, resps)
	})
}

// FuzzResponses feeds arbitrary response bytes to answer requests of the
// methods the fuzzer picks, so that most inputs are compared with net/http.
func FuzzResponses(f *testing.F) {
	for i, s := range seeds() {
		f.Add([]byte{0, 1, 2, 3}, []byte(s[1]), uint64(i))
	}
	methods := []string{"GET", "HEAD", "POST", "CONNECT"}
	f.Fuzz(func(t *testing.T, picks, resps []byte, seed uint64) {
		var reqs []byte
		for _, p := range picks[:min(len(picks), 64)] {
			m := methods[int(p)%len(methods)]
			target := "/x"
			if m == "CONNECT" {
				target = "h:443"
			}
			reqs = fmt.Appendf(reqs, "%s %s HTTP/1.1\r\nHost: h\r\n\r\n", m, target)
		}
		check(t, rand.New(rand.NewPCG(seed, seed)), reqs, resps)
	})
}
