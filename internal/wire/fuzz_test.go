package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"
)

// The fuzz targets of this file cover every parser of bytes a peer sends:
// control messages, proxy headers, replies and the session preamble. Their
// seeds run in every plain go test; the fuzzer runs with, for example,
//
//	go test -run XXX -fuzz '^FuzzReadMessage$' -fuzztime 2m -parallel 1 ./internal/wire/

// countReader counts the bytes read through it: what a parser consumed.
type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// writeLog keeps each Write apart, to check what goes out in one write.
type writeLog struct{ writes [][]byte }

func (w *writeLog) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

// framed returns body behind its u32 length, as WriteMessage frames it.
func framed(body string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// lengthOnly returns a u32 length field announcing n bytes, and no body.
func lengthOnly(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// protocolMessages are the control messages of docs/PROTOCOL.md (versions 1
// and 2), with tickets, renewals and errors.
var protocolMessages = []string{
	`{"op":"hello","hello":{"version":2,"token":"...","agent":"tunnelkit-agent","ticket":"..."}}`,
	`{"hello":{"version":2,"session_id":"3f2a...","ticket":"...","renew_after":1800}}`,
	`{"op":"bind","bind":{"proto":"http","name":"abc","options":{},"ticket":"..."}}`,
	`{"bind":{"tunnel_id":"77b0...","url":"tcp://127.0.0.1:20001","ticket":"..."}}`,
	`{"renew":{"ticket":"..."}}`,
	`{"op":"hello","hello":{"version":1,"token":"...","agent":"tunnelkit-agent"}}`,
	`{"op":"hello","hello":{"version":2,"token":"s3cret","agent":"tunnelkit-agent/0.3","ticket":"AQEAAAAAZmZmZgAEYm9iIAA"}}`,
	`{"hello":{"version":1,"session_id":"3f2a..."}}`,
	`{"hello":{"version":2,"session_id":"3f2a","ticket":"AQEAAAAA","renew_after":1800}}`,
	`{"op":"bind","bind":{"proto":"http","name":"abc","options":{}}}`,
	`{"bind":{"tunnel_id":"9c1e...","url":"http://abc.example.test:8080"}}`,
	`{"op":"bind","bind":{"proto":"tls","name":"*.app.example.test","pool":true}}`,
	`{"bind":{"tunnel_id":"51aa...","url":"tls://*.app.example.test:8443","ticket":"AQIAAAAA"}}`,
	`{"op":"bind","bind":{"proto":"tcp","port":20001}}`,
	`{"bind":{"tunnel_id":"77b0...","url":"tcp://127.0.0.1:20001"}}`,
	`{"op":"bind","bind":{"proto":"http","name":"abc","options":{"policy":"deny-all"},"ticket":"AQIAAAAA"}}`,
	`{"op":"unbind","unbind":{"tunnel_id":"9c1e..."}}`,
	`{"op":"renew","renew":{"tunnel_id":"9c1e..."}}`,
	`{"renew":{"ticket":"AQIAAAAA"}}`,
	`{}`,
	`{"error":{"code":"name_taken","message":"abc.example.test is taken"}}`,
	`{"error":{"code":"unsupported_version","message":"protocol version 1 not supported (want 2 or later)"}}`,
	`{"message":"edge shutting down"}`,
	`{"message":"edge draining","move":true}`,
	`{"message":"edge draining","move":"yes"}`,
	`{"op":"moved"}`,
	`{"op":"hello","hello":{"version":4,"token":"s3cret","agent":"tunnelkit-agent","ticket":"AQEAAAAA"}}`,
}

// nastyMessages are bodies that are valid JSON of the wrong shape, or not
// JSON at all.
var nastyMessages = []string{
	``,
	` `,
	`null`,
	`[]`,
	`"hello"`,
	`{"op":"hello"`,
	`{"op":"hello"}{"op":"bind"}`,
	`{"op":"hello"} trailing`,
	`{"op":"hello","hello":{"version":1e400}}`,
	`{"op":"hello","hello":{"version":99999999999999999999999}}`,
	`{"op":"hello","hello":{"version":-9223372036854775808}}`,
	`{"op":"hello","hello":{"version":1.5}}`,
	`{"op":"hello","hello":{"version":"2"}}`,
	`{"op":"bind","bind":{"port":-1,"pool":"yes"}}`,
	`{"op":"bind","bind":{"options":{"a":null,"b":1}}}`,
	`{"op":"bind","bind":{"options":null}}`,
	`{"OP":"Bind","BIND":{"Proto":"tcp"},"bind":{"name":"x"}}`,
	`{"op":"hello","op":"bind","hello":null,"hello":{"token":"a"},"hello":{"agent":"b"}}`,
	`{"op":"a\u0000b","hello":{"token":"\ud800\udc00\ud800"}}`,
	"{\"op\":\"a\x00b\"}",
	"{\"op\":\"\xff\xfe\xc3\"}",
	"\x00\x00\x00\x00",
	"\xef\xbb\xbf{}",
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	`{"hello":` + strings.Repeat(`{"a":`, 500) + `1` + strings.Repeat(`}`, 500) + `}`,
	`{"op":"` + strings.Repeat("x", MaxMessage-9) + `"}`,
	strings.Repeat(" ", MaxMessage-2) + "{}",
	`{"error":{"code":"x","message":"` + strings.Repeat(`\u0000`, 100) + `"}}`,
}

// FuzzReadMessage reads arbitrary bytes as a control message into a
// Request, a Response and a GoAway. ReadMessage must never panic, never
// read past the message nor more than MaxMessage body bytes, fail exactly
// as the length field and the body's length say, give the same result from
// a reader that returns one byte at a time, and decode nothing that does
// not survive being written and read again.
func FuzzReadMessage(f *testing.F) {
	for _, m := range protocolMessages {
		f.Add(framed(m))
		f.Add(append(framed(m), framed(m)...))
		f.Add(framed(m)[:len(m)/2+4])
	}
	for _, m := range nastyMessages {
		f.Add(framed(m))
	}
	for _, b := range [][]byte{
		nil,
		{0},
		{0, 0, 0},
		lengthOnly(0),
		lengthOnly(0xffffffff),
		append(lengthOnly(0xffffffff), `{"op":"hello"}`...),
		lengthOnly(MaxMessage),
		lengthOnly(MaxMessage + 1),
		append(lengthOnly(MaxMessage+1), make([]byte, MaxMessage+1)...),
		append(lengthOnly(1<<31), "{}"...),
		append(lengthOnly(100), `{"op":"hello"}`...),
		append(lengthOnly(2), `{}{}`...),
		{byte(StreamControl), 0, 0, 0, 2, '{', '}'},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReadMessage(t, data, func(r *Request) {
			if r.Bind != nil && len(r.Bind.Options) == 0 {
				r.Bind.Options = nil // omitempty: an empty map is not written
			}
		})
		checkReadMessage[Response](t, data, nil)
		checkReadMessage[GoAway](t, data, nil)

		var all, one Request
		err := ReadMessage(bytes.NewReader(data), &all)
		err1 := ReadMessage(iotest.OneByteReader(bytes.NewReader(data)), &one)
		if errString(err) != errString(err1) || err == nil && !reflect.DeepEqual(all, one) {
			t.Fatalf("%s, %v at once; %s, %v one byte at a time", show(all), err, show(one), err1)
		}
	})
}

// checkReadMessage checks ReadMessage on data into a T; norm, when not
// nil, brings a T to the form in which it is written.
func checkReadMessage[T any](t *testing.T, data []byte, norm func(*T)) {
	t.Helper()
	var v T
	cr := &countReader{r: bytes.NewReader(data)}
	err := ReadMessage(cr, &v)
	if cr.n > 4+MaxMessage {
		t.Fatalf("%T: consumed %d bytes, more than a header and MaxMessage", v, cr.n)
	}

	size := -1
	if len(data) >= 4 {
		size = int(binary.BigEndian.Uint32(data))
	}
	switch {
	case len(data) == 0:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("%T: no input: %v, want io.EOF", v, err)
		}
		return
	case len(data) < 4:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%T: %d-byte header: %v, want io.ErrUnexpectedEOF", v, len(data), err)
		}
		return
	case size > MaxMessage:
		if !errors.Is(err, ErrMessageTooLarge) || cr.n != 4 {
			t.Fatalf("%T: length %d: %v after %d bytes, want ErrMessageTooLarge after the header", v, size, err, cr.n)
		}
		return
	case len(data)-4 < size:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%T: %d of %d body bytes: %v, want io.ErrUnexpectedEOF", v, len(data)-4, size, err)
		}
		return
	}
	if cr.n != 4+size {
		t.Fatalf("%T: consumed %d bytes of a %d-byte message", v, cr.n, 4+size)
	}
	body := data[4 : 4+size]
	if err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case !strings.HasPrefix(err.Error(), "wire: "):
			t.Fatalf("%T: error without the package prefix: %v", v, err)
		case !json.Valid(body) && !errors.As(err, &syntax):
			t.Fatalf("%T: invalid JSON %s: %v, want a json.SyntaxError", v, clip(body), err)
		case json.Valid(body) && !errors.As(err, &typ):
			t.Fatalf("%T: valid JSON %s: %v, want a json.UnmarshalTypeError", v, clip(body), err)
		}
		return
	}
	if !json.Valid(body) {
		t.Fatalf("%T: accepted invalid JSON %s as %s", v, clip(body), show(v))
	}

	// What was read must survive being written and read again.
	if norm != nil {
		norm(&v)
	}
	var buf bytes.Buffer
	if err := WriteMessage(&buf, nil, &v); err != nil {
		// Escaping can make a message longer than it came in: a raw
		// '<' or invalid byte is written as six.
		if b, _ := json.Marshal(&v); errors.Is(err, ErrMessageTooLarge) && len(b) > MaxMessage {
			return
		}
		t.Fatalf("%T: writing back %s: %v", v, show(v), err)
	}
	written := bytes.Clone(buf.Bytes())
	var back T
	if err := ReadMessage(&buf, &back); err != nil || buf.Len() != 0 {
		t.Fatalf("%T: read %s, wrote %s, read back: %v, %d bytes left", v, show(v), clip(written), err, buf.Len())
	}
	if norm != nil {
		norm(&back)
	}
	if !reflect.DeepEqual(v, back) {
		t.Fatalf("%T: read %s, wrote %s, read back %s", v, show(v), clip(written), show(back))
	}
}

// clip quotes s for a failure message, cut to its first 200 bytes.
func clip[S ~string | ~[]byte](s S) string {
	if len(s) > 200 {
		return fmt.Sprintf("%q... (%d bytes)", s[:200], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// show formats a message for a failure message, as JSON.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return clip(b)
}

// describe formats a proxy header for a failure message.
func describe(h ProxyHeader) string {
	return fmt.Sprintf("{id %s proto %s client %s host %s}", clip(h.TunnelID), clip(h.Proto), clip(h.Client.String()), clip(h.Host))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Presence bits of FuzzMessageRoundTrip's has argument.
const (
	hasHello = 1 << iota
	hasBind
	hasOptions
	hasUnbind
	hasRenew
)

// FuzzMessageRoundTrip writes a Request made of fuzzed fields and reads it
// back. WriteMessage must write the prefix, the length and the JSON in one
// Write, or refuse a body over MaxMessage and write nothing; ReadMessage
// must return the request, with invalid UTF-8 replaced as encoding/json
// does (each bad byte by U+FFFD), and read nothing more.
func FuzzMessageRoundTrip(f *testing.F) {
	f.Add(OpHello, uint8(hasHello), 2, "s3cret", "tunnelkit-agent/0.3", "AQEAAAAA", "", "", 0, false, "", "", "", "", "", "", "")
	f.Add(OpBind, uint8(hasBind|hasOptions), 0, "", "", "", ProtoHTTP, "abc", 0, false, "policy", "deny-all", "", "", "AQIAAAAA", "", "")
	f.Add(OpBind, uint8(hasBind), 0, "", "", "", ProtoTLS, "*.app.example.test", 0, true, "", "", "", "", "", "", "")
	f.Add(OpBind, uint8(hasBind), 0, "", "", "", ProtoTCP, "", 20001, false, "", "", "", "", "", "", "")
	f.Add(OpUnbind, uint8(hasUnbind), 0, "", "", "", "", "", 0, false, "", "", "", "", "", "9c1e", "")
	f.Add(OpRenew, uint8(hasRenew), 0, "", "", "", "", "", 0, false, "", "", "", "", "", "", "9c1e")
	f.Add("", uint8(0), 0, "", "", "", "", "", 0, false, "", "", "", "", "", "", "")
	f.Add("hello\x00", uint8(0xff), -1<<63, "\xff", "\xc3", "\xed\xa0\x80", "<>&", "\u2028\u2029", 1<<62, true, "\xff", "\xfe", "\xfe\xfe", "\xff", "\"\\", "\x00", "\x7f")
	f.Add(OpHello, uint8(hasHello), 2, strings.Repeat("t", MaxMessage), "", "", "", "", 0, false, "", "", "", "", "", "", "")
	f.Add(OpHello, uint8(hasHello), 2, strings.Repeat("t", MaxMessage-46), "", "", "", "", 0, false, "", "", "", "", "", "", "")
	f.Add(OpHello, uint8(hasHello), 2, strings.Repeat("<", MaxMessage/6), "", "", "", "", 0, false, "", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, op string, has uint8, version int, token, agent, helloTicket,
		proto, name string, port int, pool bool, k1, v1, k2, v2, bindTicket, unbindID, renewID string) {
		req := Request{Op: op}
		if has&hasHello != 0 {
			req.Hello = &Hello{Version: version, Token: token, Agent: agent, Ticket: helloTicket}
		}
		if has&hasBind != 0 {
			req.Bind = &Bind{Proto: proto, Name: name, Port: port, Pool: pool, Ticket: bindTicket}
			if has&hasOptions != 0 {
				req.Bind.Options = map[string]string{}
				if k1 != "" || v1 != "" {
					req.Bind.Options[k1] = v1
				}
				if k2 != "" || v2 != "" {
					req.Bind.Options[k2] = v2
				}
			}
		}
		if has&hasUnbind != 0 {
			req.Unbind = &Unbind{TunnelID: unbindID}
		}
		if has&hasRenew != 0 {
			req.Renew = &Renew{TunnelID: renewID}
		}
		want, ok := asJSONReads(req)
		if !ok {
			t.Skip("two option keys that JSON makes one")
		}

		var w writeLog
		prefix := []byte{byte(StreamControl)}
		err := WriteMessage(&w, prefix, req)
		body, jerr := json.Marshal(req)
		if jerr != nil {
			t.Fatalf("json.Marshal(%#v): %v", req, jerr)
		}
		if len(body) > MaxMessage {
			if !errors.Is(err, ErrMessageTooLarge) || len(w.writes) != 0 {
				t.Fatalf("%d-byte body: %v and %d writes, want ErrMessageTooLarge and none", len(body), err, len(w.writes))
			}
			return
		}
		if err != nil || len(w.writes) != 1 {
			t.Fatalf("WriteMessage(%s): %v in %d writes, want one", show(req), err, len(w.writes))
		}
		out := w.writes[0]
		if !bytes.HasPrefix(out, prefix) || len(out) < 5 || int(binary.BigEndian.Uint32(out[1:])) != len(out)-5 {
			t.Fatalf("WriteMessage(%s) wrote %s: want the prefix and a length of what follows", show(req), clip(out))
		}
		r := bytes.NewReader(append(bytes.Clone(out[1:]), "next"...))
		var got Request
		if err := ReadMessage(r, &got); err != nil {
			t.Fatalf("wrote %s as %s, read back: %v", show(req), clip(out), err)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "next" {
			t.Fatalf("ReadMessage left %s, want the next message", clip(rest))
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("wrote %s as %s, read back %s, want %s", show(req), clip(out), show(got), show(want))
		}
	})
}

// asJSONReads returns r as encoding/json reads it back: every string with
// each invalid UTF-8 byte replaced by U+FFFD and empty options omitted. It
// reports false when two option keys become one.
func asJSONReads(r Request) (Request, bool) {
	if h := r.Hello; h != nil {
		r.Hello = &Hello{Version: h.Version, Token: validUTF8(h.Token), Agent: validUTF8(h.Agent), Ticket: validUTF8(h.Ticket)}
	}
	if b := r.Bind; b != nil {
		r.Bind = &Bind{Proto: validUTF8(b.Proto), Name: validUTF8(b.Name), Port: b.Port, Pool: b.Pool, Ticket: validUTF8(b.Ticket)}
		for k, v := range b.Options {
			if r.Bind.Options == nil {
				r.Bind.Options = map[string]string{}
			}
			if _, dup := r.Bind.Options[validUTF8(k)]; dup {
				return r, false
			}
			r.Bind.Options[validUTF8(k)] = validUTF8(v)
		}
	}
	if u := r.Unbind; u != nil {
		r.Unbind = &Unbind{TunnelID: validUTF8(u.TunnelID)}
	}
	if n := r.Renew; n != nil {
		r.Renew = &Renew{TunnelID: validUTF8(n.TunnelID)}
	}
	r.Op = validUTF8(r.Op)
	return r, true
}

// validUTF8 replaces each byte of s that is not part of valid UTF-8 with
// U+FFFD, as encoding/json's encoder does.
func validUTF8(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// TestReadMessageAllocatesWhatArrives checks that a header announcing
// MaxMessage bytes, followed by 10 bytes and the end of the stream, costs
// the reader what arrived, not what was announced.
func TestReadMessageAllocatesWhatArrives(t *testing.T) {
	const runs = 1000
	head := lengthOnly(MaxMessage)
	body := []byte(`{"op":"hel`)
	readers := make([]io.Reader, runs)
	for i := range readers {
		readers[i] = io.MultiReader(bytes.NewReader(head), bytes.NewReader(body))
	}
	errs := make([]error, runs)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, r := range readers {
		errs[i] = ReadMessage(r, new(Request))
	}
	runtime.ReadMemStats(&after)
	for _, err := range errs {
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("ReadMessage of a short body: %v, want io.ErrUnexpectedEOF", err)
		}
	}
	per := (after.TotalAlloc - before.TotalAlloc) / runs
	t.Logf("%d bytes allocated per call", per)
	if per >= 8<<10 {
		t.Errorf("ReadMessage allocated %d bytes per call for a 10-byte body announced as %d", per, MaxMessage)
	}
}

// proxyBody returns the body of a proxy header with raw fields, the client
// in its binary form.
func proxyBody(id, proto string, client []byte, host string) []byte {
	b := append([]byte{byte(len(id))}, id...)
	b = append(append(b, byte(len(proto))), proto...)
	b = append(append(b, byte(len(client))), client...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(host)))
	return append(b, host...)
}

// FuzzParseProxyHeader parses arbitrary bytes as a proxy header body, and
// reads them as a proxy stream after its type byte. Neither may panic; a
// failure is ErrMalformed (or io.ErrUnexpectedEOF for a short stream) with
// a zero header; ReadProxyHeader consumes exactly the u16 length and body
// and agrees with ParseProxyHeader; a parsed header written again is the
// same bytes (less the ignored trailing fields) and reads back equal.
func FuzzParseProxyHeader(f *testing.F) {
	v4 := netip.MustParseAddrPort("203.0.113.7:51234")
	v6 := netip.MustParseAddrPort("[2001:db8::1]:443")
	zoned := netip.MustParseAddrPort("[fe80::1%eth0]:8080")
	mapped := netip.MustParseAddrPort("[::ffff:192.0.2.1%x]:1")
	for _, h := range []ProxyHeader{
		{TunnelID: "9c1e", Proto: ProtoHTTP, Client: v4, Host: "abc.example.test"},
		{TunnelID: "51aa", Proto: ProtoTLS, Client: v6, Host: "x.app.example.test"},
		{TunnelID: "77b0", Proto: ProtoTCP, Client: zoned},
		{TunnelID: "77b0", Proto: ProtoTCP, Client: mapped},
		{},
		{TunnelID: strings.Repeat("i", 255), Proto: strings.Repeat("p", 255), Client: v6, Host: strings.Repeat("h", 1000)},
	} {
		b, err := AppendProxyStream(nil, h)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[3:])
		f.Add(append(b[3:], 0xff, 0xff, 'x'))
		f.Add(b[1:])
		f.Add(b[1 : len(b)-1])
	}
	client := func(s string) []byte { b, _ := netip.MustParseAddrPort(s).MarshalBinary(); return b }
	for _, b := range [][]byte{
		nil,
		{0},
		{0, 0, 0},
		{0, 0, 0, 0, 0},
		{0xff, 0xff},
		{0xff, 0xff, 0xff, 0xff, 0xff},
		proxyBody("t", "http", nil, ""),
		proxyBody("t", "http", []byte{0x50, 0}, ""),
		proxyBody("t", "http", []byte{1}, ""),
		proxyBody("t", "http", []byte{1, 2, 3}, ""),
		proxyBody("t", "http", make([]byte, 17), ""),
		proxyBody("t", "http", make([]byte, 255), ""),
		proxyBody("t", "http", append(client("[fe80::1]:1"), "\x00\xff%"...), ""),
		proxyBody("t\x00", "\xff", client("1.2.3.4:0"), "\r\nX: y"),
		proxyBody("", "", nil, strings.Repeat("h", 0xffff-5)),
		proxyBody(strings.Repeat("i", 255), "", nil, strings.Repeat("h", 0xffff-5-255)),
		proxyBody("t", "http", client("1.2.3.4:5"), "")[:9],
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseProxyHeader(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || h != (ProxyHeader{}) {
				t.Fatalf("ParseProxyHeader: %s, %v; want a zero header and ErrMalformed", describe(h), err)
			}
		} else {
			checkProxyHeaderAgain(t, data, h)
		}

		// The same bytes as a stream: u16 length, body, what follows.
		cr := &countReader{r: bytes.NewReader(data)}
		sh, serr := ReadProxyHeader(cr)
		if len(data) < 2 || len(data)-2 < int(binary.BigEndian.Uint16(data)) {
			if !errors.Is(serr, io.ErrUnexpectedEOF) || sh != (ProxyHeader{}) {
				t.Fatalf("ReadProxyHeader of %d bytes: %s, %v; want io.ErrUnexpectedEOF", len(data), describe(sh), serr)
			}
			return
		}
		n := 2 + int(binary.BigEndian.Uint16(data))
		ph, perr := ParseProxyHeader(data[2:n])
		if cr.n != n || sh != ph || errString(serr) != errString(perr) {
			t.Fatalf("ReadProxyHeader: %s, %v after %d bytes; ParseProxyHeader: %s, %v of %d", describe(sh), serr, cr.n, describe(ph), perr, n)
		}
	})
}

// checkProxyHeaderAgain writes h, which ParseProxyHeader read from body,
// and checks that it is the same bytes and reads back as h.
func checkProxyHeaderAgain(t *testing.T, body []byte, h ProxyHeader) {
	t.Helper()
	if len(h.TunnelID) > 255 || len(h.Proto) > 255 || len(h.Host) > 0xffff {
		t.Fatalf("parsed fields longer than their length prefixes allow: %d, %d, %d", len(h.TunnelID), len(h.Proto), len(h.Host))
	}
	// A client field without a valid address (empty: unknown, or a port
	// alone) is written back empty; every other field is written as read.
	clientAt := 2 + len(h.TunnelID) + len(h.Proto)
	oldLen, newLen := int(body[clientAt]), int(body[clientAt])
	if !h.Client.Addr().IsValid() {
		newLen = 0
	}
	size := clientAt + 1 + newLen + 2 + len(h.Host)
	b, err := AppendProxyStream([]byte("pre"), h)
	if size > 0xffff {
		if err == nil {
			t.Fatalf("AppendProxyStream(%s) wrote a %d-byte body", describe(h), size)
		}
		return // not a header a stream can carry
	}
	if err != nil {
		t.Fatalf("AppendProxyStream(%s) of a parsed header: %v", describe(h), err)
	}
	if string(b[:3]) != "pre" || b[3] != byte(StreamProxy) || int(binary.BigEndian.Uint16(b[4:])) != len(b)-6 {
		t.Fatalf("AppendProxyStream(%s) = %s: want the prefix, the type and the body's length", describe(h), clip(b))
	}
	again := b[6:]
	want := append(append(bytes.Clone(body[:clientAt]), byte(newLen)), body[clientAt+1+oldLen-newLen:clientAt+1+oldLen+2+len(h.Host)]...)
	if !bytes.Equal(want, again) {
		t.Fatalf("parsed %s as %s, wrote back %s, want %s", clip(body), describe(h), clip(again), clip(want))
	}
	if newLen == 0 {
		h.Client = netip.AddrPort{} // what a reader gets back: unknown
	}
	r := bytes.NewReader(append(bytes.Clone(b[4:]), "conn"...))
	h2, err := ReadProxyHeader(r)
	if err != nil || h2 != h {
		t.Fatalf("parsed %s, wrote %s, read back %s, %v", describe(h), clip(b), describe(h2), err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "conn" {
		t.Fatalf("ReadProxyHeader left %s, want the connection's bytes", clip(rest))
	}
}

// FuzzProxyHeaderRoundTrip writes proxy headers of fuzzed fields: any
// tunnel id, proto and host, any client (none, IPv4, IPv6, zoned IPv6,
// mapped IPv4, or a port without an address), with pad bytes added to one
// field to cross the length limits. AppendProxyStream must fail, leaving
// its buffer as it was, exactly when a field or the body is over its
// length prefix; otherwise ReadProxyHeader must give back the header.
func FuzzProxyHeaderRoundTrip(f *testing.F) {
	// padding returns a pad argument that adds n bytes to the zone (field
	// 0), the tunnel id (1), the proto (2) or the host (3).
	padding := func(field, n int) uint32 { return uint32(n<<2 | field) }
	f.Add("9c1e", ProtoHTTP, []byte{203, 0, 113, 7}, "", uint16(51234), "abc.example.test", uint32(0))
	f.Add("51aa", ProtoTLS, netip.MustParseAddr("2001:db8::1").AsSlice(), "", uint16(443), "x.app.example.test", uint32(0))
	f.Add("77b0", ProtoTCP, netip.MustParseAddr("fe80::1").AsSlice(), "eth0", uint16(8080), "", uint32(0))
	f.Add("77b0", ProtoTCP, netip.MustParseAddr("::ffff:192.0.2.1").AsSlice(), "\x00", uint16(1), "", uint32(0))
	f.Add("", "", []byte(nil), "", uint16(0), "", uint32(0))
	f.Add("", "", []byte(nil), "", uint16(80), "", uint32(0))
	f.Add("", "", make([]byte, 16), "z", uint16(0), "", padding(0, 237))
	f.Add("", "", make([]byte, 16), "z", uint16(0), "", padding(0, 236))
	f.Add("i", "", []byte(nil), "", uint16(0), "", padding(1, 254))
	f.Add("i", "", []byte(nil), "", uint16(0), "", padding(1, 255))
	f.Add("", "p", []byte(nil), "", uint16(0), "", padding(2, 254))
	f.Add("", "p", []byte(nil), "", uint16(0), "", padding(2, 255))
	f.Add("", "", []byte(nil), "", uint16(0), "", padding(3, 0xffff-7))
	f.Add("", "", []byte(nil), "", uint16(0), "", padding(3, 0xffff-6))
	f.Add("", "", []byte(nil), "", uint16(0), "", padding(3, 0xffff))
	f.Add("", "", []byte(nil), "", uint16(0), "", padding(3, 0x10000))
	f.Fuzz(func(t *testing.T, id, proto string, addr []byte, zone string, port uint16, host string, pad uint32) {
		n := int(pad>>2) % 0x10100
		switch pad & 3 {
		case 0:
			zone += strings.Repeat("z", n)
		case 1:
			id += strings.Repeat("i", n)
		case 2:
			proto += strings.Repeat("p", n)
		case 3:
			host += strings.Repeat("h", n)
		}
		var ip netip.Addr
		clientLen := 0 // a client without an address is unknown: an empty field
		switch {
		case len(addr) >= 16:
			ip = netip.AddrFrom16([16]byte(addr)).WithZone(zone)
			clientLen = 2 + 16 + len(zone)
		case len(addr) >= 4:
			ip = netip.AddrFrom4([4]byte(addr))
			clientLen = 2 + 4
		default:
			port = 0 // a port alone is not written
		}
		h := ProxyHeader{TunnelID: id, Proto: proto, Client: netip.AddrPortFrom(ip, port), Host: host}
		bodyLen := 1 + len(id) + 1 + len(proto) + 1 + clientLen + 2 + len(host)
		fits := len(id) <= 255 && len(proto) <= 255 && clientLen <= 255 && len(host) <= 0xffff && bodyLen <= 0xffff

		b, err := AppendProxyStream([]byte("pre"), h)
		if !fits {
			if err == nil || string(b) != "pre" {
				t.Fatalf("%d-byte body (id %d, proto %d, client %d, host %d): %v, buffer %d bytes; want an error and the buffer as it was",
					bodyLen, len(id), len(proto), clientLen, len(host), err, len(b))
			}
			return
		}
		if err != nil || len(b) != 3+1+2+bodyLen || string(b[:3]) != "pre" || b[3] != byte(StreamProxy) {
			t.Fatalf("AppendProxyStream(%s): %d bytes, %v; want %d", describe(h), len(b), err, 3+1+2+bodyLen)
		}
		r := bytes.NewReader(append(bytes.Clone(b[4:]), "conn"...))
		got, err := ReadProxyHeader(r)
		if err != nil || got != h {
			t.Fatalf("wrote %s, read back %s, %v", describe(h), describe(got), err)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "conn" {
			t.Fatalf("ReadProxyHeader left %s, want the connection's bytes", clip(rest))
		}
	})
}

// FuzzReadReply reads arbitrary bytes as a reply. ReadReply must never
// panic; it fails with io.ErrUnexpectedEOF on a short input and with
// ErrMalformedReply, having read only the 3-byte head, on a message longer
// than MaxReplyMessage; otherwise it consumes exactly the reply, which
// AppendReply writes back as the same bytes.
func FuzzReadReply(f *testing.F) {
	for _, r := range []Reply{
		{Status: ReplyOK},
		{Status: ReplyAppUnreachable, Message: "dial tcp 127.0.0.1:3000: connect: connection refused"},
		{Status: ReplyNoEndpoint, Message: "no listener for tunnel 9c1e"},
		{Status: 0xff, Message: "\x00\r\n\xff"},
		{Status: ReplyAppUnreachable, Message: strings.Repeat("m", MaxReplyMessage)},
	} {
		b := AppendReply(nil, r)
		f.Add(b)
		f.Add(append(b, "GET / HTTP/1.1\r\n"...))
		f.Add(b[:len(b)-1])
	}
	for _, b := range [][]byte{
		nil,
		{0},
		{0, 0},
		{1, 0xff, 0xff},
		{1, 0x04, 0x01},
		append([]byte{1, 0x04, 0x01}, make([]byte, MaxReplyMessage+1)...),
		{1, 0x04, 0x00},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cr := &countReader{r: bytes.NewReader(data)}
		r, err := ReadReply(cr)
		if err != nil && r != (Reply{}) {
			t.Fatalf("ReadReply: %d %s with error %v", r.Status, clip(r.Message), err)
		}
		if len(data) < 3 {
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("ReadReply of %d bytes: %v, want io.ErrUnexpectedEOF", len(data), err)
			}
			return
		}
		n := int(binary.BigEndian.Uint16(data[1:]))
		switch {
		case n > MaxReplyMessage:
			if !errors.Is(err, ErrMalformedReply) || cr.n != 3 {
				t.Fatalf("%d-byte message: %v after %d bytes, want ErrMalformedReply after 3", n, err, cr.n)
			}
		case len(data)-3 < n:
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%d of %d message bytes: %v, want io.ErrUnexpectedEOF", len(data)-3, n, err)
			}
		default:
			if err != nil || cr.n != 3+n || r.Status != data[0] || r.Message != string(data[3:3+n]) {
				t.Fatalf("ReadReply(%s) = %d %s, %v after %d bytes", clip(data), r.Status, clip(r.Message), err, cr.n)
			}
			if b := AppendReply(nil, r); !bytes.Equal(b, data[:3+n]) {
				t.Fatalf("read %s, AppendReply wrote %s", clip(data[:3+n]), clip(b))
			}
		}
	})
}

// FuzzReplyRoundTrip writes replies of any status and message (pad adds
// bytes to cross MaxReplyMessage): AppendReply must keep what b held, cut
// the message to MaxReplyMessage bytes, and ReadReply must read exactly
// that back.
func FuzzReplyRoundTrip(f *testing.F) {
	f.Add(ReplyOK, "", uint16(0))
	f.Add(ReplyAppUnreachable, "connection refused", uint16(0))
	f.Add(ReplyNoEndpoint, "é", uint16(MaxReplyMessage-2))
	f.Add(uint8(0xff), "", uint16(MaxReplyMessage))
	f.Add(uint8(7), "x", uint16(MaxReplyMessage))
	f.Add(uint8(7), "", uint16(0xffff))
	f.Fuzz(func(t *testing.T, status uint8, msg string, pad uint16) {
		msg += strings.Repeat("m", int(pad))
		want := Reply{Status: status, Message: msg[:min(len(msg), MaxReplyMessage)]}
		b := AppendReply([]byte("pre"), Reply{Status: status, Message: msg})
		if string(b[:3]) != "pre" || len(b) != 3+3+len(want.Message) {
			t.Fatalf("AppendReply of %d message bytes: %s", len(msg), clip(b))
		}
		r := bytes.NewReader(b[3:])
		got, err := ReadReply(r)
		if err != nil || got != want || r.Len() != 0 {
			t.Fatalf("wrote %d %s, read back %d %s, %v, %d bytes left", want.Status, clip(want.Message), got.Status, clip(got.Message), err, r.Len())
		}
	})
}

// FuzzReadPreamble reads 0-16 arbitrary bytes as a session preamble.
// ReadPreamble must never panic, must succeed exactly when the magic is
// right and the window within [MinWindow, MaxWindow], must read only the
// 8 bytes of a preamble, and must fail with a *PreambleError wrapping
// ErrPreamble, holding the bytes read, in every failure: saying that the
// input ended when it ended within a preamble's beginning.
func FuzzReadPreamble(f *testing.F) {
	for _, s := range []string{
		"TKT1\x00\x04\x00\x00",
		"TKT1\x00\x01\x00\x00",
		"TKT1\x00\x00\xff\xff",
		"TKT1\x01\x00\x00\x00",
		"TKT1\x01\x00\x00\x01",
		"TKT1\xff\xff\xff\xff",
		"TKT1\x00\x00\x00\x00",
		"TKT1\x00\x04\x00\x00muxado",
		"TKT2\x00\x04\x00\x00",
		"tkt1\x00\x04\x00\x00",
		"TKT1\x00\x04",
		"TKT",
		"",
		"GET / HTTP/1.1\r\n",
		"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
		"\x00\x00\x00\x00\x00\x00\x00\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		data = data[:min(len(data), 16)]
		cr := &countReader{r: bytes.NewReader(data)}
		w, err := ReadPreamble(cr)
		if cr.n != min(len(data), 8) {
			t.Fatalf("ReadPreamble of %d bytes read %d", len(data), cr.n)
		}
		var want uint32
		if len(data) >= 8 && string(data[:4]) == "TKT1" {
			want = binary.BigEndian.Uint32(data[4:])
		}
		if want >= MinWindow && want <= MaxWindow {
			if err != nil || w != want {
				t.Fatalf("ReadPreamble(%q) = %d, %v; want %d", data, w, err, want)
			}
			return
		}
		var pe *PreambleError
		if !errors.Is(err, ErrPreamble) || !errors.As(err, &pe) || w != 0 {
			t.Fatalf("ReadPreamble(%q) = %d, %v; want a PreambleError", data, w, err)
		}
		if !bytes.Equal(pe.Got, data[:cr.n]) {
			t.Fatalf("ReadPreamble(%q): Got %q, want the %d bytes read", data, pe.Got, cr.n)
		}
		magic := "TKT1"[:min(len(data), 4)]
		ended := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if len(data) < 8 && string(data[:len(magic)]) == magic && !ended {
			t.Fatalf("ReadPreamble of %d bytes: %v, want it to say the input ended", len(data), err)
		}
	})
}

// FuzzPreambleRoundTrip writes a preamble for any window: one 8-byte Write
// that ReadPreamble reads back when the window is valid and refuses with
// ErrPreamble when not. ClampWindow of the window, as an int, is always a
// window that round trips.
func FuzzPreambleRoundTrip(f *testing.F) {
	for _, w := range []uint32{0, 1, MinWindow - 1, MinWindow, DefaultWindow, MaxWindow, MaxWindow + 1, 1 << 31, 0xffffffff} {
		f.Add(w)
	}
	f.Fuzz(func(t *testing.T, window uint32) {
		for _, w := range []uint32{window, ClampWindow(int(window)), ClampWindow(int(int32(window)))} {
			var log writeLog
			if err := WritePreamble(&log, w); err != nil || len(log.writes) != 1 || len(log.writes[0]) != 8 {
				t.Fatalf("WritePreamble(%d): %v, writes %q; want one of 8 bytes", w, err, log.writes)
			}
			got, err := ReadPreamble(bytes.NewReader(log.writes[0]))
			if w >= MinWindow && w <= MaxWindow {
				if err != nil || got != w {
					t.Fatalf("window %d read back as %d, %v", w, got, err)
				}
			} else if !errors.Is(err, ErrPreamble) {
				t.Fatalf("window %d: %d, %v; want ErrPreamble", w, got, err)
			}
		}
		for _, w := range []uint32{ClampWindow(int(window)), ClampWindow(int(int32(window)))} {
			if w < MinWindow || w > MaxWindow {
				t.Fatalf("ClampWindow of %d gave %d, outside [MinWindow, MaxWindow]", window, w)
			}
		}
	})
}

// FuzzPrintable checks that Printable returns the first max bytes of s (or
// all of it), each printable ASCII byte kept and every other one made '?'.
func FuzzPrintable(f *testing.F) {
	f.Add("plain text", 64)
	f.Add("line\r\nforged=1", 64)
	f.Add("\x1b[31mred\x00\x7f\x80\xff", 64)
	f.Add("é", 1)
	f.Add("abcdef", 3)
	f.Add("", 0)
	f.Add("abc", 0)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 0 {
			t.Skip("a negative max is a caller's bug: no caller passes one")
		}
		out := Printable(s, max)
		if len(out) != min(len(s), max) {
			t.Fatalf("Printable(%q, %d) = %q: %d bytes", s, max, out, len(out))
		}
		for i := range len(out) {
			c := out[i]
			if c < 0x20 || c > 0x7e {
				t.Fatalf("Printable(%q, %d) = %q: byte %#x at %d", s, max, out, c, i)
			}
			if in := s[i]; in >= 0x20 && in <= 0x7e && c != in || (in < 0x20 || in > 0x7e) && c != '?' {
				t.Fatalf("Printable(%q, %d) = %q: byte %d is %q for %q", s, max, out, i, c, in)
			}
		}
	})
}

// FuzzReadRelayHeader reads arbitrary bytes as the opening of a relay
// stream. It may not panic; a failure is ErrMalformed or
// io.ErrUnexpectedEOF with nothing returned; a header read is written
// again as the same bytes it consumed (less a proxy header's ignored
// trailing fields and an invalid client address) and reads back equal.
func FuzzReadRelayHeader(f *testing.F) {
	v4 := netip.MustParseAddrPort("203.0.113.7:51234")
	for _, c := range []struct {
		session string
		h       ProxyHeader
	}{
		{"3f2a9c1e51aa77b0", ProxyHeader{TunnelID: "9c1e", Proto: ProtoHTTP, Client: v4, Host: "abc.example.test"}},
		{"", ProxyHeader{}},
		{strings.Repeat("s", 255), ProxyHeader{TunnelID: "t", Proto: ProtoTCP}},
	} {
		b, err := AppendRelayStream(nil, c.session, c.h)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(b, "after"...))
	}
	f.Add([]byte{})
	f.Add([]byte{5, 'a', 'b'})
	f.Add([]byte{0, 9, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		cr := &countReader{r: bytes.NewReader(data)}
		session, h, err := ReadRelayHeader(cr)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, io.ErrUnexpectedEOF) || session != "" || h != (ProxyHeader{}) {
				t.Fatalf("ReadRelayHeader: %q, %s, %v; want nothing and ErrMalformed or io.ErrUnexpectedEOF", clip([]byte(session)), describe(h), err)
			}
			return
		}
		if len(session) != int(data[0]) || session != string(data[1:1+len(session)]) {
			t.Fatalf("session %q from %s", clip([]byte(session)), clip(data))
		}
		b, err := AppendRelayStream(nil, session, h)
		if err != nil {
			return // a parsed header too long to write again (the host grew no longer than read)
		}
		_, h2, err := ReadRelayHeader(bytes.NewReader(b))
		if err != nil || h2 != h {
			t.Fatalf("wrote %s back, read %s, %v", describe(h), describe(h2), err)
		}
		if len(b) > cr.n {
			t.Fatalf("wrote %d bytes back from a header of %d", len(b), cr.n)
		}
	})
}

// TestGoAwayMoveIgnoredByOlderAgents: an agent of version 3 reads a goaway
// that asks it to move as the goaway it knows, a message and nothing else.
func TestGoAwayMoveIgnoredByOlderAgents(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMessage(&b, nil, GoAway{Message: "edge draining", Move: true}); err != nil {
		t.Fatal(err)
	}
	var v3 struct {
		Message string `json:"message"`
	}
	if err := ReadMessage(&b, &v3); err != nil || v3.Message != "edge draining" {
		t.Fatalf("a version 3 agent read %+v, %v", v3, err)
	}
}
