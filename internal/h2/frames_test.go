package h2

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"golang.org/x/crypto/cryptobyte"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// wire writes one direction's frames for tests.
type wire struct {
	bytes.Buffer
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

// newWire returns a wire whose first frame, SETTINGS, is written, after
// the client preface if client.
func newWire(client bool, settings ...http2.Setting) *wire {
	w := new(wire)
	if client {
		w.WriteString(http2.ClientPreface)
	}
	w.fr = http2.NewFramer(w, nil)
	w.enc = hpack.NewEncoder(&w.hb)
	w.fr.WriteSettings(settings...)
	return w
}

// block encodes header fields, given as names and values.
func (w *wire) block(kv ...string) []byte {
	w.hb.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		w.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return bytes.Clone(w.hb.Bytes())
}

func (w *wire) headers(id uint32, end bool, kv ...string) *wire {
	w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: w.block(kv...), EndStream: end, EndHeaders: true})
	return w
}

func (w *wire) data(id uint32, end bool, n int) *wire {
	w.fr.WriteData(id, end, make([]byte, n))
	return w
}

// rawHeader writes a frame header alone, with any length.
func (w *wire) rawHeader(length uint32, typ http2.FrameType, flags http2.Flags, id uint32) *wire {
	var b cryptobyte.Builder
	b.AddUint24(length)
	b.AddUint8(uint8(typ))
	b.AddUint8(uint8(flags))
	b.AddUint32(id)
	w.Write(b.BytesOrPanic())
	return w
}

func get(path string) []string {
	return []string{":method", "GET", ":scheme", "http", ":authority", "example.com", ":path", path}
}

// run feeds reqs and then resps to a Conn at random splits and returns the
// exchanges it reported, formatted, and its error.
func run(r *rand.Rand, reqs, resps []byte) (string, error) {
	got, _, err := runHooks(r, reqs, resps)
	return got, err
}

// runHooks is run, and also returns what the Conn passed to Header and
// Data, formatted: each block as "stream>fields" ("<" for a response's),
// and the payload of consecutive DATA of one stream and direction as
// "stream>data:bytes", whatever pieces they came in.
func runHooks(r *rand.Rand, reqs, resps []byte) (got, hooks string, err error) {
	var xs, events []string
	var last string // the data event in progress, merged with the next piece
	var data []byte
	flush := func() {
		if last != "" {
			events = append(events, fmt.Sprintf("%s:%q", last, data))
			last, data = "", nil
		}
	}
	dir := func(response bool) string {
		if response {
			return "<"
		}
		return ">"
	}
	c := &Conn{Done: func(x Exchange) {
		xs = append(xs, fmt.Sprintf("%s %s %d %d %v", x.Method, x.Target, x.Status, x.Bytes, x.Reset))
		if x.Stream == 0 {
			xs = append(xs, "stream 0")
		}
	}, Header: func(id uint32, response bool, fields []hpack.HeaderField, end bool) {
		flush()
		ev := fmt.Sprintf("%d%s%v", id, dir(response), fields)
		if end {
			ev += " end"
		}
		events = append(events, ev)
	}, Data: func(id uint32, response bool, p []byte) {
		if len(p) == 0 {
			events = append(events, "empty data")
		}
		if ev := fmt.Sprintf("%d%sdata", id, dir(response)); ev != last {
			flush()
			last = ev
		}
		data = append(data, p...)
	}}
	split(r, reqs, c.Request)
	split(r, resps, c.Response)
	err = c.Err()
	c.ResponseEOF()
	flush()
	return strings.Join(xs, "; "), strings.Join(events, "; "), err
}

// split calls f with p cut at random places.
func split(r *rand.Rand, p []byte, f func([]byte)) {
	for len(p) > 0 {
		n := len(p)
		switch r.IntN(3) {
		case 0:
			n = min(n, 1+r.IntN(3))
		case 1:
			n = min(n, 1+r.IntN(64))
		}
		f(p[:n])
		p = p[n:]
	}
}

// TestFrames checks what a Conn reports for exchanges built frame by frame.
func TestFrames(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tests := []struct {
		name        string
		reqs, resps func() []byte
		want        string
	}{{
		name: "get",
		reqs: func() []byte { return newWire(true).headers(1, true, get("/a?b=c")...).Bytes() },
		resps: func() []byte {
			return newWire(false).headers(1, false, ":status", "200").data(1, false, 10).data(1, true, 3).Bytes()
		},
		want: "GET /a?b=c 200 13 false",
	}, {
		name: "interim, padding, trailers",
		reqs: func() []byte {
			w := newWire(true)
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: w.block(get("/p")...), EndHeaders: true, PadLength: 7,
				Priority: http2.PriorityParam{StreamDep: 0, Weight: 200}})
			return w.data(1, true, 5).Bytes()
		},
		resps: func() []byte {
			w := newWire(false).headers(1, false, ":status", "100").headers(1, false, ":status", "103", "link", "</x>").headers(1, false, ":status", "201")
			w.fr.WriteDataPadded(1, false, make([]byte, 20), make([]byte, 9))
			return w.headers(1, true, "x-checksum", "abc").Bytes()
		},
		want: "GET /p 201 20 false",
	}, {
		name: "continuations, connect, resets",
		reqs: func() []byte {
			w := newWire(true)
			b := w.block(":method", "POST", ":scheme", "http", ":authority", "h", ":path", "/long", "x-big", strings.Repeat("v", 40000))
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:10000]})
			w.fr.WriteContinuation(1, false, b[10000:20000])
			w.fr.WriteContinuation(1, true, b[20000:])
			w.headers(3, false, ":method", "CONNECT", ":authority", "h:443")
			w.headers(5, false, get("/c")...)
			w.fr.WriteRSTStream(5, http2.ErrCodeCancel)
			return w.Bytes()
		},
		resps: func() []byte {
			w := newWire(false).headers(3, false, ":status", "200").data(3, false, 7)
			w.fr.WriteRSTStream(3, http2.ErrCodeConnect)
			w.headers(1, false, ":status", "404").data(1, true, 1)
			w.headers(5, true, ":status", "200") // after the client's reset
			return w.Bytes()
		},
		want: "GET /c 0 0 true; CONNECT h:443 200 7 true; POST /long 404 1 false",
	}, {
		name: "push ignored, settings",
		reqs: func() []byte {
			w := newWire(true, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 100}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20})
			w.enc.SetMaxDynamicTableSizeLimit(65536) // the server's SETTINGS below allow it
			w.fr.WriteSettingsAck()
			w.fr.WritePing(false, [8]byte{})
			w.fr.WriteWindowUpdate(0, 1000)
			w.headers(1, true, get("/s")...)
			w.fr.WriteRawFrame(0x42, 0, 0, []byte("unknown frames are skipped"))
			return w.Bytes()
		},
		resps: func() []byte {
			w := newWire(false, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 65536})
			w.enc.SetMaxDynamicTableSizeLimit(100)
			w.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: w.block(get("/pushed")...), EndHeaders: true})
			w.headers(2, false, ":status", "200").data(2, true, 99)
			w.headers(1, false, ":status", "200", "x-long", strings.Repeat("z", 50))
			w.fr.WriteData(1, true, make([]byte, 100000)) // allowed by the client's SETTINGS_MAX_FRAME_SIZE
			return w.Bytes()
		},
		want: "GET /s 200 100000 false",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, resps := tt.reqs(), tt.resps()
			var first string
			for i := range 20 {
				got, hooks, err := runHooks(r, reqs, resps)
				if err != nil || got != tt.want {
					t.Fatalf("got %q, %v\nwant %q", got, err, tt.want)
				}
				if i == 0 {
					first = hooks
				} else if hooks != first {
					t.Fatalf("Header and Data passed\n%s\nat one split, and\n%s\nat another", first, hooks)
				}
			}
		})
	}
}

// TestHooks checks what a Conn passes to Header and Data: every block of
// an open stream, pseudo-fields first; DATA payloads without padding; no
// block or DATA of a pushed, reset or ended stream.
func TestHooks(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	w := newWire(true)
	w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: w.block(":method", "POST", ":scheme", "http", ":authority", "h", ":path", "/p", "content-type", "text/plain"), EndHeaders: true, PadLength: 7})
	w.fr.WriteDataPadded(1, false, []byte("hello"), make([]byte, 3))
	w.fr.WriteData(1, false, []byte(" world"))
	w.headers(1, true, "x-sum", "1")
	w.headers(3, false, get("/reset")...)
	w.fr.WriteRSTStream(3, http2.ErrCodeCancel)
	w.fr.WriteData(3, true, []byte("after the reset"))
	reqs := w.Bytes()

	w = newWire(false)
	w.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: w.block(get("/pushed")...), EndHeaders: true})
	w.headers(2, false, ":status", "200").data(2, true, 4)
	w.headers(1, false, ":status", "103", "link", "</x>")
	w.headers(1, false, ":status", "200", "content-type", "text/plain")
	w.fr.WriteDataPadded(1, false, []byte("answer"), make([]byte, 200))
	w.fr.WriteData(1, false, nil)
	w.headers(1, true, "grpc-status", "0")
	w.fr.WriteData(1, true, []byte("after the end"))
	resps := w.Bytes()

	want := `1>[header field ":method" = "POST" header field ":scheme" = "http" header field ":authority" = "h" header field ":path" = "/p" header field "content-type" = "text/plain"]; ` +
		`1>data:"hello world"; 1>[header field "x-sum" = "1"] end; ` +
		`3>[header field ":method" = "GET" header field ":scheme" = "http" header field ":authority" = "example.com" header field ":path" = "/reset"]; ` +
		`1<[header field ":status" = "103" header field "link" = "</x>"]; 1<[header field ":status" = "200" header field "content-type" = "text/plain"]; ` +
		`1<data:"answer"; 1<[header field "grpc-status" = "0"] end`
	for range 20 {
		got, hooks, err := runHooks(r, reqs, resps)
		if err != nil || got != "GET /reset 0 0 true; POST /p 200 6 false" {
			t.Fatalf("exchanges %q, %v", got, err)
		}
		if hooks != want {
			t.Fatalf("Header and Data passed\n%s\nwant\n%s", hooks, want)
		}
	}
}

// TestHostile feeds malformed and oversized input: observing stops with
// the right error, and nothing panics.
func TestHostile(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ok := func() []byte { return newWire(false).headers(1, true, ":status", "200").Bytes() }
	tests := []struct {
		name        string
		reqs, resps func() []byte
		want        error // nil: any error
	}{
		{"bad preface", func() []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }, ok, ErrMalformed},
		{"first frame not SETTINGS", func() []byte {
			w := newWire(true)
			w.Reset()
			w.WriteString(http2.ClientPreface)
			return w.headers(1, true, get("/")...).Bytes()
		}, ok, ErrMalformed},
		{"CONTINUATION without HEADERS", func() []byte {
			w := newWire(true)
			w.fr.WriteContinuation(1, true, w.block(get("/")...))
			return w.Bytes()
		}, ok, ErrMalformed},
		{"frame inside a header block", func() []byte {
			w := newWire(true)
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: w.block(get("/")...)})
			w.fr.WritePing(false, [8]byte{})
			return w.Bytes()
		}, ok, ErrMalformed},
		{"oversized header block", func() []byte {
			w := newWire(true)
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: w.block(get("/")...)})
			for range 70 {
				w.fr.WriteContinuation(1, false, make([]byte, 16000))
			}
			return w.Bytes()
		}, ok, ErrTooLarge},
		{"huge frame length", func() []byte {
			return newWire(true).rawHeader(1<<24-1, http2.FrameData, 0, 1).Bytes()
		}, ok, ErrTooLarge},
		{"frame above the default SETTINGS_MAX_FRAME_SIZE", func() []byte {
			return newWire(true).headers(1, false, get("/")...).data(1, true, 20000).Bytes()
		}, ok, ErrTooLarge},
		{"garbage after the preface", func() []byte {
			return append([]byte(http2.ClientPreface), "\x00\x00\x06\x04\x00\x00\x00\x00\x00garbage garbage garbage"...)
		}, ok, nil},
		{"DATA on stream 0", func() []byte { return newWire(true).data(0, true, 3).Bytes() }, ok, ErrMalformed},
		{"SETTINGS on a stream", func() []byte {
			return newWire(true).rawHeader(0, http2.FrameSettings, 0, 1).Bytes()
		}, ok, ErrMalformed},
		{"RST_STREAM of the wrong length", func() []byte {
			w := newWire(true)
			w.fr.WriteRawFrame(http2.FrameRSTStream, 0, 1, []byte{1, 2, 3})
			return w.Bytes()
		}, ok, ErrMalformed},
		{"padding longer than the DATA", func() []byte {
			w := newWire(true)
			w.fr.WriteRawFrame(http2.FrameData, http2.FlagDataPadded, 1, []byte{9, 1, 2})
			return w.Bytes()
		}, ok, ErrMalformed},
		{"undecodable header block", func() []byte {
			w := newWire(true)
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0x7f}, EndHeaders: true})
			return w.Bytes()
		}, ok, ErrMalformed},
		{"table size update above the SETTINGS", func() []byte {
			w := newWire(true)
			w.enc.SetMaxDynamicTableSizeLimit(8192)
			w.enc.SetMaxDynamicTableSize(8192)
			return w.headers(1, true, get("/")...).Bytes()
		}, ok, ErrMalformed},
		{"HEADERS on an even stream", func() []byte { return newWire(true).headers(2, true, get("/")...).Bytes() }, ok, ErrMalformed},
		{"PUSH_PROMISE from the client", func() []byte {
			w := newWire(true)
			w.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 3, BlockFragment: w.block(get("/")...), EndHeaders: true})
			return w.Bytes()
		}, ok, ErrMalformed},
		{"response without a request", func() []byte { return newWire(true).Bytes() }, ok, ErrMalformed},
		{"response without :status", func() []byte { return newWire(true).headers(1, true, get("/")...).Bytes() },
			func() []byte { return newWire(false).headers(1, true, "x", "y").Bytes() }, ErrMalformed},
		{"too many streams", func() []byte {
			w := newWire(true)
			for i := range maxStreams + 1 {
				w.headers(uint32(2*i+1), true, get("/")...)
			}
			return w.Bytes()
		}, ok, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, resps := tt.reqs(), tt.resps()
			splits := 3
			if testtools.RaceEnabled && len(reqs)+len(resps) > maxHeaderBlock {
				splits = 1 // .ci/run runs the three without the race detector
			}
			for range splits {
				if _, err := run(r, reqs, resps); err == nil || tt.want != nil && !errors.Is(err, tt.want) {
					t.Fatalf("Err() = %v, want %v", err, tt.want)
				}
			}
		})
	}
}
