package main

// The attacks of the hostile phase. Each runs until its context is done,
// counting what it did and what the edge answered, and returns once its
// goroutines and connections are gone. The public ones aim at the same
// endpoints as the well-behaved client, from addresses of their own.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// attackNames are the attacks, numbered from 1.
var attackNames = []string{
	"double hello",
	"streams before hello",
	"no-keep-alive flood",
	"slow bodies",
	"idle TCP",
	"wrong tokens",
	"half-close",
	"malformed chunked",
	"idle upgrades",
	"endpoint hoarding",
}

// target is what the attacks aim at.
type target struct {
	cfg       *config
	agentAddr string // the edge's agent port
	httpAddr  string // its public HTTP port
	tcpAddr   string // the well-behaved client's TCP endpoint
}

// attack is one attack's counts.
type attack struct {
	n    int // its number, from 1
	t    tally
	note string // set by the attack: a fact the counts do not tell
	// held is how many connections it held when the well-behaved client
	// finished.
	held int64
}

// refusedPause is how long an attack waits before reopening a connection
// the edge refused at once, so that refusals do not turn it into a
// connection flood that measures this program rather than the edge.
const refusedPause = time.Second

// startAttacks starts the enabled attacks, which run until ctx is done;
// wait waits for them to end. Attack 10 gets its session first: the wrong
// tokens of attack 6 soon make the edge close every new agent connection
// from 127.0.0.1, the only source this program has on the agent port.
func startAttacks(ctx context.Context, tg *target) (attacks []*attack, wait func()) {
	var wg sync.WaitGroup
	start := func(n int, f func(context.Context, *target, *attack)) {
		if !tg.cfg.enabled(n) {
			return
		}
		a := &attack{n: n}
		attacks = append(attacks, a)
		wg.Go(func() { f(ctx, tg, a) })
	}
	if tg.cfg.enabled(10) {
		bobUp := make(chan struct{})
		start(10, func(ctx context.Context, tg *target, a *attack) { hoardEndpoints(ctx, tg, a, bobUp) })
		select {
		case <-bobUp:
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
	}
	start(1, doubleHello)
	start(2, streamsBeforeHello)
	start(3, flood)
	start(4, slowBodies)
	start(5, idleTCP)
	start(6, wrongTokens)
	start(7, halfClose)
	start(8, badChunked)
	start(9, idleUpgrades)
	return attacks, wg.Wait
}

// rawSession opens a muxado session to the edge as a hand-written agent:
// the preamble, then muxado. An error wrapping errClosedAtAccept means the
// edge closed the connection before answering the preamble.
func rawSession(ctx context.Context, addr string) (muxado.Session, error) {
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := wire.WritePreamble(c, wire.DefaultWindow); err != nil {
		c.Close()
		return nil, closedAtAccept(err)
	}
	window, err := wire.ReadPreamble(c)
	if err != nil {
		c.Close()
		return nil, closedAtAccept(err)
	}
	c.SetDeadline(time.Time{})
	return muxado.Client(c, wire.MuxConfig(window)), nil
}

var errClosedAtAccept = errors.New("closed before the preamble")

func closedAtAccept(err error) error {
	if closedEarly(err) {
		return fmt.Errorf("%w: %w", errClosedAtAccept, err)
	}
	return err
}

// helloMessage is a hello request as a control stream's first bytes.
func helloMessage(token string) []byte {
	var b strings.Builder
	wire.WriteMessage(&b, []byte{byte(wire.StreamControl)}, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: token}})
	return []byte(b.String())
}

// hello sends msg on a new control stream of s and returns the answer.
func hello(s muxado.Session, msg []byte) (wire.Response, error) {
	var resp wire.Response
	st, err := s.OpenStream()
	if err != nil {
		return resp, err
	}
	defer st.Close()
	if _, err := st.Write(msg); err != nil {
		return resp, err
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	return resp, wire.ReadMessage(st, &resp)
}

// sessionOutcome counts a failed rawSession.
func sessionOutcome(a *attack, err error) time.Duration {
	if errors.Is(err, errClosedAtAccept) {
		a.t.inc("closed at accept")
		return 10 * time.Millisecond
	}
	a.t.inc("dial: " + reason(err))
	return refusedPause
}

// doubleHello (1): sessions that each send two hellos with a valid token
// on two control streams at once. The edge must grant at most one.
func doubleHello(ctx context.Context, tg *target, a *attack) {
	msg := helloMessage("alice-token")
	var wg sync.WaitGroup
	for range tg.cfg.HelloLoops {
		wg.Go(func() {
			for ctx.Err() == nil {
				s, err := rawSession(ctx, tg.agentAddr)
				if err != nil {
					sleep(ctx, sessionOutcome(a, err))
					continue
				}
				stop := closeOnDone(ctx, s)
				a.t.inc("sessions")
				var granted atomic.Int32
				var both sync.WaitGroup
				for range 2 {
					both.Go(func() {
						resp, err := hello(s, msg)
						switch {
						case err != nil:
							a.t.inc("hello: no answer (" + reason(err) + ")")
						case resp.HelloResp != nil:
							granted.Add(1)
						case resp.Error != nil:
							a.t.inc("hello: refused " + resp.Error.Code)
						}
					})
				}
				both.Wait()
				a.t.inc(fmt.Sprintf("granted %d", granted.Load()))
				stop()
				s.Close()
			}
		})
	}
	wg.Wait()
}

// streamsBeforeHello (2): sessions that, before any hello, open thousands
// of streams, each announcing a 64 KiB control message and sending one
// byte of it; reopened as the edge closes them.
func streamsBeforeHello(ctx context.Context, tg *target, a *attack) {
	announce := []byte{byte(wire.StreamControl), 0, 1, 0, 0, '{'} // 65536 bytes to come
	var maxClose atomic.Int64
	var wg sync.WaitGroup
	for range tg.cfg.PreHelloConns {
		wg.Go(func() {
			for ctx.Err() == nil {
				s, err := rawSession(ctx, tg.agentAddr)
				if err != nil {
					sleep(ctx, sessionOutcome(a, err))
					continue
				}
				stop := closeOnDone(ctx, s)
				a.t.inc("sessions")
				start := time.Now()
				n := int64(0)
				for range tg.cfg.PreHelloStreams {
					st, err := s.OpenStream()
					if err != nil {
						break
					}
					if _, err := st.Write(announce); err != nil {
						break
					}
					n++
				}
				a.t.add("streams", n)
				ended := make(chan struct{})
				go func() { s.Wait(); close(ended) }()
				select {
				case <-ended:
					if ctx.Err() == nil {
						a.t.inc("closed by the edge")
						d := int64(time.Since(start))
						for m := maxClose.Load(); d > m && !maxClose.CompareAndSwap(m, d); m = maxClose.Load() {
						}
					}
				case <-time.After(15 * time.Second):
					a.t.inc("open 15 s after its streams")
				case <-ctx.Done():
				}
				stop()
				s.Close()
				<-ended
			}
		})
	}
	wg.Wait()
	a.note = fmt.Sprintf("slowest close %v after the first stream", time.Duration(maxClose.Load()).Round(time.Millisecond))
}

// wrongTokens (6): hellos with a wrong token from one source, in a tight
// loop. The edge refuses the first ones and then closes the source's
// connections at accept.
func wrongTokens(ctx context.Context, tg *target, a *attack) {
	msg := helloMessage("wrong-token")
	for ctx.Err() == nil {
		s, err := rawSession(ctx, tg.agentAddr)
		if err != nil {
			if errors.Is(err, errClosedAtAccept) {
				a.t.inc("closed at accept")
				continue
			}
			a.t.inc("dial: " + reason(err))
			sleep(ctx, refusedPause)
			continue
		}
		stop := closeOnDone(ctx, s)
		resp, err := hello(s, msg)
		switch {
		case err != nil:
			a.t.inc("no answer (" + reason(err) + ")")
		case resp.Error != nil:
			a.t.inc("refused " + resp.Error.Code)
		case resp.HelloResp != nil:
			a.t.inc("GRANTED")
		}
		stop()
		s.Close()
	}
}

// hoardEndpoints (10): a second identity's session binds endpoints until
// the edge refuses one, then holds them. up is closed once the session
// is open.
func hoardEndpoints(ctx context.Context, tg *target, a *attack, up chan<- struct{}) {
	c := &agent.Client{Addrs: []string{tg.agentAddr}, Token: "bob-token", MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	defer c.Close()
	bound := 0
	var upOnce sync.Once
	var first time.Time // the first bind's grant
	for ctx.Err() == nil && bound < tg.cfg.MaxBinds {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Listen(bctx, fmt.Sprintf("http://hoard%d", bound))
		cancel()
		if err == nil {
			if bound++; bound == 1 {
				first = time.Now()
			}
			upOnce.Do(func() { close(up) })
			continue
		}
		if bound == 0 && ctx.Err() == nil {
			// No session yet: the edge closed it at accept, or it failed.
			a.t.inc("session attempts failed")
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		if ctx.Err() == nil {
			a.note = "then refused: " + addrRE.ReplaceAllString(err.Error(), "ADDR")
		}
		break
	}
	upOnce.Do(func() { close(up) })
	a.t.add("bound", int64(bound))
	if bound > 1 {
		took := fmt.Sprintf("%d binds in %v", bound-1, time.Since(first).Round(time.Millisecond))
		if a.note == "" {
			a.note = took
		} else {
			a.note = took + ", " + a.note
		}
	}
	<-ctx.Done()
}

// requestAs sends raw on a new connection to the edge's HTTP port from
// src, calls then (if not nil) on the connection, and reads the response.
func requestAs(ctx context.Context, tg *target, src *source, raw string, then func(net.Conn)) (*http.Response, []byte, error) {
	c, err := dialAs(ctx, tg.httpAddr, src.next())
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	stop := closeOnDone(ctx, c)
	defer stop()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		return nil, nil, err
	}
	if then != nil {
		then(c)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body, err
}

// status names a response by its status and the edge's error code.
func status(resp *http.Response) string {
	s := fmt.Sprint(resp.StatusCode)
	if code := resp.Header.Get("Tunnelkit-Error"); code != "" {
		s += " " + code
	}
	return s
}

// flood (3): requests each on a new connection, FloodConcurrency at a
// time, like hey -c 50 -disable-keepalive.
func flood(ctx context.Context, tg *target, a *attack) {
	src := attackers(3, tg.cfg.AddrsPerAttack)
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dialAs(ctx, tg.httpAddr, src.next()) },
	}
	client := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	var wg sync.WaitGroup
	for range tg.cfg.FloodConcurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+appHost+"/", nil)
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						a.t.inc("status: error " + reason(err))
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				a.t.inc("status: " + status(resp))
				if resp.StatusCode != http.StatusOK {
					sleep(ctx, 10*time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
}

// slowBodies (4): requests whose body of 100000 bytes comes a few bytes
// at a time every TrickleEvery, SlowBodies at once, each reopened when the
// edge answers or closes it.
func slowBodies(ctx context.Context, tg *target, a *attack) {
	src := attackers(4, tg.cfg.AddrsPerAttack)
	var wg sync.WaitGroup
	for i := range tg.cfg.SlowBodies {
		wg.Go(func() {
			// Spread the trickles over the period.
			if !sleep(ctx, tg.cfg.TrickleEvery*time.Duration(i)/time.Duration(tg.cfg.SlowBodies)) {
				return
			}
			for ctx.Err() == nil {
				if !slowBody(ctx, tg, a, src) {
					sleep(ctx, refusedPause)
				}
			}
		})
	}
	wg.Wait()
}

// slowBody runs one slow request until the edge answers or closes it; it
// reports whether the request was held for a while.
func slowBody(ctx context.Context, tg *target, a *attack, src *source) bool {
	c, err := dialAs(ctx, tg.httpAddr, src.next())
	if err != nil {
		if ctx.Err() == nil {
			a.t.inc("dial: " + reason(err))
		}
		return false
	}
	defer c.Close()
	stop := closeOnDone(ctx, c)
	defer stop()
	a.t.inc("opened")
	release := a.t.hold()
	defer release()
	start := time.Now()
	if _, err := io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: "+appHost+"\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\nslow"); err != nil {
		a.t.inc("closed: " + reason(err))
		return false
	}
	br := bufio.NewReader(c)
	for ctx.Err() == nil {
		// Anything from the edge is its answer; silence means trickle on.
		c.SetReadDeadline(time.Now().Add(tg.cfg.TrickleEvery))
		_, err := br.Peek(1)
		if err == nil {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				a.t.inc("closed: bad response: " + reason(err))
			} else {
				resp.Body.Close()
				a.t.inc("answered " + status(resp))
			}
			return time.Since(start) > refusedPause
		}
		if ctx.Err() != nil {
			break
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			a.t.inc("closed without an answer: " + reason(err))
			return time.Since(start) > refusedPause
		}
		if _, err := io.WriteString(c, "..."); err != nil {
			a.t.inc("closed while trickling: " + reason(err))
			return time.Since(start) > refusedPause
		}
	}
	return true
}

// idleTCP (5): connections to the TCP endpoint that send their PROXY
// header and nothing else, IdleTCP at once, reopened when closed.
func idleTCP(ctx context.Context, tg *target, a *attack) {
	src := attackers(5, tg.cfg.AddrsPerAttack)
	var wg sync.WaitGroup
	for range tg.cfg.IdleTCP {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := dialAs(ctx, tg.tcpAddr, src.next())
				if err != nil {
					if ctx.Err() == nil {
						a.t.inc("dial: " + reason(err))
						sleep(ctx, refusedPause)
					}
					continue
				}
				a.t.inc("opened")
				release := a.t.hold()
				stop := closeOnDone(ctx, c)
				if n := tg.cfg.IdleBurst; n > 0 {
					if err := burst(c, n); err != nil {
						if ctx.Err() == nil {
							a.t.inc("burst failed: " + reason(err))
						}
						stop()
						c.Close()
						release()
						sleep(ctx, refusedPause)
						continue
					}
				}
				start := time.Now()
				_, err = c.Read(make([]byte, 1))
				stop()
				c.Close()
				release()
				if ctx.Err() != nil {
					break
				}
				held := time.Since(start)
				if held < refusedPause {
					a.t.inc("closed by the edge at once: " + reason(err))
					sleep(ctx, refusedPause)
				} else {
					a.t.inc("closed by the edge after a while: " + reason(err))
				}
			}
		})
	}
	wg.Wait()
}

// burst sends n bytes on c and reads their echo.
func burst(c net.Conn, n int) error {
	c.SetDeadline(time.Now().Add(15 * time.Second))
	defer c.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, n))
		errc <- err
	}()
	_, err := io.ReadFull(c, make([]byte, n))
	if werr := <-errc; err == nil {
		err = werr
	}
	return err
}

// halfClose (7): requests whose client half-closes its side right after
// sending; the response must still come whole.
func halfClose(ctx context.Context, tg *target, a *attack) {
	src := attackers(7, tg.cfg.AddrsPerAttack)
	cw := func(c net.Conn) { c.(interface{ CloseWrite() error }).CloseWrite() }
	var wg sync.WaitGroup
	for range tg.cfg.HalfClose {
		wg.Go(func() {
			for ctx.Err() == nil {
				resp, body, err := requestAs(ctx, tg, src, "GET /half HTTP/1.1\r\nHost: "+appHost+"\r\n\r\n", cw)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					a.t.inc("status: error " + reason(err))
					sleep(ctx, 10*time.Millisecond)
				case resp.StatusCode == http.StatusOK && string(body) != "ok\n":
					a.t.inc(fmt.Sprintf("status: 200 with a wrong body %q", trim(body, 20)))
				default:
					a.t.inc("status: " + status(resp))
				}
			}
		})
	}
	wg.Wait()
}

// badChunked (8): POSTs whose chunked body is malformed; the edge should
// answer 400.
func badChunked(ctx context.Context, tg *target, a *attack) {
	src := attackers(8, tg.cfg.AddrsPerAttack)
	raw := "POST /chunked HTTP/1.1\r\nHost: " + appHost + "\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
	var wg sync.WaitGroup
	for range tg.cfg.BadChunked {
		wg.Go(func() {
			for ctx.Err() == nil {
				resp, _, err := requestAs(ctx, tg, src, raw, nil)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					a.t.inc("status: error " + reason(err))
					sleep(ctx, 10*time.Millisecond)
				default:
					a.t.inc("status: " + status(resp))
				}
			}
		})
	}
	wg.Wait()
}

// idleUpgrades (9): upgraded connections (Connection: Upgrade) held idle,
// Upgrades at once, reopened when closed.
func idleUpgrades(ctx context.Context, tg *target, a *attack) {
	src := attackers(9, tg.cfg.AddrsPerAttack)
	raw := "GET /ws HTTP/1.1\r\nHost: " + appHost + "\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
	var wg sync.WaitGroup
	for range tg.cfg.Upgrades {
		wg.Go(func() {
			for ctx.Err() == nil {
				if !idleUpgrade(ctx, tg, a, src, raw) {
					sleep(ctx, refusedPause)
				}
			}
		})
	}
	wg.Wait()
}

// idleUpgrade holds one upgraded connection until the edge closes it; it
// reports whether the upgrade was granted.
func idleUpgrade(ctx context.Context, tg *target, a *attack, src *source, raw string) bool {
	c, err := dialAs(ctx, tg.httpAddr, src.next())
	if err != nil {
		if ctx.Err() == nil {
			a.t.inc("dial: " + reason(err))
		}
		return false
	}
	defer c.Close()
	stop := closeOnDone(ctx, c)
	defer stop()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, raw); err != nil {
		a.t.inc("status: error " + reason(err))
		return false
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		if ctx.Err() == nil {
			a.t.inc("status: error " + reason(err))
		}
		return false
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		a.t.inc("status: " + status(resp))
		return false
	}
	a.t.inc("status: 101")
	release := a.t.hold()
	defer release()
	c.SetDeadline(time.Time{})
	_, err = br.ReadByte() // idle until the edge closes it
	if ctx.Err() == nil {
		a.t.inc("closed by the edge: " + reason(err))
	}
	return true
}

// describe is the line of the report for a.
func (a *attack) describe() string {
	t := &a.t
	var b strings.Builder
	fmt.Fprintf(&b, "%2d %-21s ", a.n, attackNames[a.n-1]+":")
	join := func(items []string) string {
		if len(items) == 0 {
			return "none"
		}
		return strings.Join(items, ", ")
	}
	switch a.n {
	case 1:
		fmt.Fprintf(&b, "%d sessions said hello twice at once: %d had both granted, %d one, %d none; %s",
			t.get("sessions"), t.get("granted 2"), t.get("granted 1"), t.get("granted 0"),
			join(t.with("hello: ")))
		if n := t.get("closed at accept"); n > 0 {
			fmt.Fprintf(&b, " (%d connections closed at accept)", n)
		}
	case 2:
		fmt.Fprintf(&b, "%d sessions opened %d streams before a hello; %d closed by the edge, %d still open 15 s later; %s; %d connections closed at accept",
			t.get("sessions"), t.get("streams"), t.get("closed by the edge"), t.get("open 15 s after its streams"), a.note, t.get("closed at accept"))
	case 3, 7, 8:
		fmt.Fprintf(&b, "%d requests: %s", sum(t, "status: "), join(t.with("status: ")))
	case 4:
		fmt.Fprintf(&b, "%d opened (at most %d open at once, %d open at the end); %s",
			t.get("opened"), t.peak.Load(), a.held, join(append(t.with("answered "), append(t.whole("closed"), t.with("dial: ")...)...)))
	case 5:
		fmt.Fprintf(&b, "%d opened (at most %d open at once, %d open at the end); %s",
			t.get("opened"), t.peak.Load(), a.held, join(append(t.whole("closed"), t.with("dial: ")...)))
	case 6:
		fmt.Fprintf(&b, "%d hellos with a wrong token answered: %s; %d connections closed at accept",
			sum(t, "refused ")+t.get("GRANTED")+sum(t, "no answer"), join(append(append(t.with("refused "), t.with("GRANTED")...), t.with("no answer")...)), t.get("closed at accept"))
	case 9:
		fmt.Fprintf(&b, "%d upgrades asked (at most %d upgraded at once, %d at the end): %s",
			sum(t, "status: "), t.peak.Load(), a.held, join(append(t.with("status: "), append(t.whole("closed"), t.with("dial: ")...)...)))
	case 10:
		fmt.Fprintf(&b, "bob's session bound %d endpoints", t.get("bound"))
		if a.note != "" {
			fmt.Fprintf(&b, ", %s", a.note)
		}
		if n := t.get("session attempts failed"); n > 0 {
			fmt.Fprintf(&b, " (%d attempts to open the session failed)", n)
		}
	}
	return b.String()
}

// sum adds the counts whose keys start with prefix.
func sum(t *tally, prefix string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for k, v := range t.m {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}
