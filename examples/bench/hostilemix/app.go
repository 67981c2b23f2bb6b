package main

// The agent side, in this process: an app, an echo server, and the agent
// that exposes them through the edge. Kept simple so that it is never
// what slows the client down.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
)

// appHost is the public name of the app.
const appHost = "app.example.test"

// backend is the app, the echo server and the agent of one phase.
type backend struct {
	app     *http.Server
	appLn   net.Listener
	echoLn  net.Listener
	agent   *agent.Client
	tcpAddr string // the public address of the TCP endpoint

	mu    sync.Mutex
	conns map[net.Conn]struct{} // hijacked and echo conns
	wg    sync.WaitGroup

	drops     atomic.Int64 // agent sessions that ended during the phase
	dropMu    sync.Mutex
	dropWhy   []string
	forwardWG sync.WaitGroup
}

// startBackend starts the app and the echo server, connects the agent to
// the edge at agentAddr and binds http://app and a tcp:// endpoint.
func startBackend(ctx context.Context, agentAddr string) (*backend, error) {
	b := &backend{conns: map[net.Conn]struct{}{}}
	var err error
	if b.appLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	if b.echoLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		b.appLn.Close()
		return nil, err
	}
	b.app = &http.Server{Handler: http.HandlerFunc(b.serveApp), ErrorLog: log.New(io.Discard, "", 0)}
	b.wg.Go(func() { b.app.Serve(b.appLn) })
	b.wg.Go(b.serveEcho)

	b.agent = &agent.Client{Addrs: []string{agentAddr}, Token: "alice-token", OnEvent: b.onEvent}
	fail := func(err error) (*backend, error) {
		b.close()
		return nil, err
	}
	httpL, err := b.agent.Listen(ctx, "http://app")
	if err != nil {
		return fail(fmt.Errorf("bind http://app: %w", err))
	}
	tcpL, err := b.agent.Listen(ctx, "tcp://")
	if err != nil {
		return fail(fmt.Errorf("bind tcp://: %w", err))
	}
	u, err := url.Parse(tcpL.URL())
	if err != nil {
		return fail(fmt.Errorf("tcp endpoint %q: %w", tcpL.URL(), err))
	}
	b.tcpAddr = u.Host
	b.forwardWG.Go(func() { forward.Bytes{To: b.appLn.Addr().String()}.Serve(httpL) })
	b.forwardWG.Go(func() { forward.Bytes{To: b.echoLn.Addr().String()}.Serve(tcpL) })
	return b, nil
}

func (b *backend) onEvent(e agent.Event) {
	if e.Kind != agent.Disconnected {
		return
	}
	b.drops.Add(1)
	b.dropMu.Lock()
	if len(b.dropWhy) < 5 {
		b.dropWhy = append(b.dropWhy, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), e.Err))
	}
	b.dropMu.Unlock()
}

// serveApp answers GET with "ok\n", echoes POST bodies, and upgrades
// requests that ask for it, then echoes the upgraded connection.
func (b *backend) serveApp(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Header.Get("Upgrade") != "":
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if !b.track(conn, true) {
			conn.Close()
			return
		}
		defer b.track(conn, false)
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		if brw.Flush() != nil {
			return
		}
		echo(conn, brw)
	case r.Method == http.MethodPost:
		// The whole body first: HTTP/1 handlers must read before writing.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		w.Write(body)
	default:
		io.WriteString(w, "ok\n")
	}
}

// serveEcho echoes each conn of the echo server.
func (b *backend) serveEcho() {
	for {
		c, err := b.echoLn.Accept()
		if err != nil {
			return
		}
		if !b.track(c, true) {
			c.Close()
			continue
		}
		b.wg.Go(func() {
			defer b.track(c, false)
			defer c.Close()
			echo(c, c)
		})
	}
}

// echo copies r to w through a small buffer of its own. io.Copy between
// two TCP conns would splice through a pipe, two more descriptors for
// each idle conn.
func echo(w io.Writer, r io.Reader) {
	io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, make([]byte, 4<<10))
}

// track adds c to the conns close will end, unless closing has begun, or
// removes it.
func (b *backend) track(c net.Conn, add bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !add {
		delete(b.conns, c)
		return true
	}
	if b.conns == nil {
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

// dropReasons returns why the agent's sessions ended, the first few.
func (b *backend) dropReasons() []string {
	b.dropMu.Lock()
	defer b.dropMu.Unlock()
	return append([]string(nil), b.dropWhy...)
}

// close stops the agent, the app and the echo server, and waits for them.
func (b *backend) close() {
	if b.agent != nil {
		b.agent.Close()
	}
	b.forwardWG.Wait()
	b.app.Close()
	b.echoLn.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// waitServed waits until a GET through the edge is answered 200, from an
// address of its own.
func waitServed(ctx context.Context, httpAddr string) error {
	src := newSource(goodAddr.Next())
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dialAs(ctx, httpAddr, src.next()) },
	}}
	deadline := time.Now().Add(10 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		resp, err := client.Get("http://" + appHost + "/")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return errors.Join(errors.New("the app is not served through the edge"), last)
}
