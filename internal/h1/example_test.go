package h1_test

import (
	"fmt"

	"github.com/tunnelkit/tunnelkit/internal/h1"
)

func ExampleConn() {
	var c h1.Conn
	c.Done = func(x h1.Exchange) {
		fmt.Println(x.Method, x.Target, x.Status, x.Bytes, x.Upgraded)
	}
	// Two pipelined requests, then their responses in odd pieces.
	c.Request([]byte("GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\n" +
		"HEAD /logo.png HTTP/1.1\r\nHost: example.com\r\n\r\n"))
	fmt.Println("waiting:", c.Waiting())
	c.Response([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHel"))
	c.Response([]byte("lo\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5120\r\n\r\n"))
	fmt.Println("waiting:", c.Waiting(), "err:", c.Err())
	// Output:
	// waiting: true
	// GET /index.html 200 5 false
	// HEAD /logo.png 200 0 false
	// waiting: false err: <nil>
}
