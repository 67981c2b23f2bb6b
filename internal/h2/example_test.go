package h2_test

import (
	"bytes"
	"fmt"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tunnelkit/tunnelkit/internal/h2"
)

func ExampleConn() {
	var c h2.Conn
	c.Done = func(x h2.Exchange) {
		fmt.Println(x.Method, x.Target, x.Status, x.Bytes, x.Reset)
	}

	// The frames a client and a server would send, written with x/net/http2.
	var reqs, resps, block bytes.Buffer
	reqs.WriteString(http2.ClientPreface)
	client, server := http2.NewFramer(&reqs, nil), http2.NewFramer(&resps, nil)
	enc := hpack.NewEncoder(&block)
	headers := func(fr *http2.Framer, id uint32, end bool, kv ...string) {
		block.Reset()
		for i := 0; i < len(kv); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndStream: end, EndHeaders: true})
	}
	client.WriteSettings()
	headers(client, 1, true, ":method", "GET", ":scheme", "http", ":authority", "example.com", ":path", "/index.html")
	headers(client, 3, true, ":method", "GET", ":scheme", "http", ":authority", "example.com", ":path", "/slow")
	server.WriteSettings()
	headers(server, 1, false, ":status", "200")
	server.WriteData(1, true, []byte("Hello"))
	client.WriteRSTStream(3, http2.ErrCodeCancel)

	// The copier hands them over in whatever pieces it reads.
	c.Request(reqs.Next(30))
	c.Request(reqs.Next(reqs.Len() - 13))
	c.Response(resps.Bytes())
	c.Request(reqs.Bytes())
	c.ResponseEOF()
	fmt.Println("err:", c.Err())
	// Output:
	// GET /index.html 200 5 false
	// GET /slow 0 0 true
	// err: <nil>
}
