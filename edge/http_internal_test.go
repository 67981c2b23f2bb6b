package edge

import (
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// tokens returns the comma-separated tokens of values, trimmed, empty ones
// left out.
func tokens(values []string) []string {
	var out []string
	for _, v := range values {
		for p := range strings.SplitSeq(v, ",") {
			if p = textproto.TrimString(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// dropH2CUpgrade reads a client's Upgrade and Connection headers. The fuzz
// target runs with, for example,
//
//	go test -run XXX -fuzz '^FuzzDropH2CUpgrade$' -fuzztime 1m -parallel 1 ./edge/
//
// For any headers (values separated by newlines): a request that does not
// ask for h2c is left as it came; one that does loses the h2c tokens of
// Upgrade, HTTP2-Settings, and the Connection tokens that name what went,
// and keeps every other token, in its order.
func FuzzDropH2CUpgrade(f *testing.F) {
	for _, seed := range [][3]string{
		{"h2c", "Upgrade, HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"},
		{"H2C", "upgrade", ""},
		{"h2c, websocket", "Upgrade, HTTP2-Settings, X-Hop", "AAMA"},
		{"websocket", "Upgrade", ""},
		{"websocket\nh2c", "keep-alive\nUpgrade", "x"},
		{"h2c", "", "AAMA"},
		{" , h2c ,, ", " ,upgrade, ,close", ""},
		{"h2c/1.0", "Upgrade", ""},
		{"", "Upgrade", "AAMA"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, upgrade, connection, settings string) {
		h := http.Header{}
		for k, v := range map[string]string{"Upgrade": upgrade, "Connection": connection, "Http2-Settings": settings} {
			if v != "" {
				h[k] = strings.Split(v, "\n")
			}
		}
		before := h.Clone()
		dropH2CUpgrade(h)
		isH2C := func(p string) bool { return strings.EqualFold(p, "h2c") }
		if !slices.ContainsFunc(tokens(before["Upgrade"]), isH2C) {
			if !reflect.DeepEqual(h, before) {
				t.Fatalf("no h2c asked for: %q became %q", before, h)
			}
			return
		}
		if _, ok := h["Http2-Settings"]; ok {
			t.Fatalf("%q: HTTP2-Settings kept: %q", before, h)
		}
		left := slices.DeleteFunc(tokens(before["Upgrade"]), isH2C)
		if got := tokens(h["Upgrade"]); !slices.Equal(got, left) || len(left) == 0 && h["Upgrade"] != nil {
			t.Fatalf("%q: Upgrade %q; want %q", before, h["Upgrade"], left)
		}
		gone := func(p string) bool {
			return strings.EqualFold(p, "http2-settings") || len(left) == 0 && strings.EqualFold(p, "upgrade")
		}
		want := slices.DeleteFunc(tokens(before["Connection"]), gone)
		if got := tokens(h["Connection"]); !slices.Equal(got, want) || len(want) == 0 && h["Connection"] != nil {
			t.Fatalf("%q: Connection %q; want %q", before, h["Connection"], want)
		}
	})
}
