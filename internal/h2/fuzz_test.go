package h2

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http2"
)

// recorded returns the bytes of real h2c connections between Go's client
// and server: a few small exchanges of each kind.
func recorded(tb testing.TB) (reqs, resps [][]byte) {
	c, url, p := h2c(tb, http.HandlerFunc(handler), true)
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/small?a=b", ""},
		{"GET", "/empty", ""},
		{"GET", "/404", ""},
		{"GET", "/trailers", ""},
		{"POST", "/echo", "a request body"},
		{"POST", "/grpc.Service/Get", "\x00\x00\x00\x00\x02hi"},
		{"POST", "/grpc.Service/Fail", "\x00\x00\x00\x00\x02hi"},
	} {
		req, _ := http.NewRequest(r.method, url+r.path, strings.NewReader(r.body))
		resp, err := c.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	rq, rp := p.finish(tb)
	for i := range rq {
		reqs, resps = append(reqs, rq[i].Bytes()), append(resps, rp[i].Bytes())
	}
	return reqs, resps
}

// FuzzConn feeds arbitrary request and response bytes at arbitrary splits:
// nothing may panic, and where the bytes are cut must not change what is
// reported, exchanges, header blocks and DATA payloads.
func FuzzConn(f *testing.F) {
	reqs, resps := recorded(f)
	for i := range reqs {
		f.Add(reqs[i], resps[i], uint64(i))
	}
	w := newWire(true).headers(1, true, get("/a")...)
	w.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	f.Add(w.Bytes(), newWire(false).headers(1, false, ":status", "103").headers(1, false, ":status", "200").data(1, true, 5).Bytes(), uint64(99))
	f.Fuzz(func(t *testing.T, reqs, resps []byte, seed uint64) {
		whole, wh, werr := runHooks(rand.New(rand.NewPCG(seed, 0)), reqs, resps)
		split, sh, serr := runHooks(rand.New(rand.NewPCG(seed, 1)), reqs, resps)
		if whole != split || wh != sh || fmt.Sprint(werr) != fmt.Sprint(serr) {
			t.Fatalf("splits change the outcome:\n%q, %v\n%.2000s\n%q, %v\n%.2000s", whole, werr, wh, split, serr, sh)
		}
	})
}

// TestRecorded checks that the recorded connections are observed without
// an error.
func TestRecorded(t *testing.T) {
	reqs, resps := recorded(t)
	for i := range reqs {
		got, err := run(rand.New(rand.NewPCG(uint64(i), 0)), reqs[i], resps[i])
		if err != nil || got == "" {
			t.Errorf("connection %d: %q, %v", i, got, err)
		}
	}
}
