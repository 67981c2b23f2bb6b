package main

// Connections as the load balancer makes them, and the counting every
// client of the benchmark does.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
)

// goodAddr is the well-behaved client's address.
var goodAddr = netip.MustParseAddr("203.0.113.5")

// source hands out client address:port pairs, a new port each time, from
// a few addresses in turn.
type source struct {
	addrs []netip.Addr
	n     atomic.Uint32
}

func newSource(addrs ...netip.Addr) *source { return &source{addrs: addrs} }

// attackers returns the source of attack n: addresses 198.51.100.(10n+1)
// to (10n+k), k at most 9.
func attackers(n, k int) *source {
	k = min(max(k, 1), 9)
	s := &source{}
	for i := 1; i <= k; i++ {
		s.addrs = append(s.addrs, netip.AddrFrom4([4]byte{198, 51, 100, byte(10*n + i)}))
	}
	return s
}

func (s *source) next() netip.AddrPort {
	i := s.n.Add(1)
	a := s.addrs[int(i)%len(s.addrs)]
	return netip.AddrPortFrom(a, uint16(1024+i%64000))
}

var dialer = net.Dialer{Timeout: 10 * time.Second}

// dialAs connects to addr as the client from: the connection starts with a
// PROXY v1 header, as a load balancer's would.
func dialAs(ctx context.Context, addr string, from netip.AddrPort) (net.Conn, error) {
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	port := 0
	if _, p, err := net.SplitHostPort(addr); err == nil {
		port, _ = strconv.Atoi(p)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(port))
	if err := proxyproto.Write(c, 1, from, dst); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// closeOnDone closes c when ctx is done; call the returned func once c is
// closed otherwise.
func closeOnDone(ctx context.Context, c io.Closer) func() bool {
	return context.AfterFunc(ctx, func() { c.Close() })
}

// sleep waits d, or less when ctx is done; it reports whether ctx is live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

var addrRE = regexp.MustCompile(`\[?[0-9a-fA-F:.]+\]?:\d+`)

// reason names an error briefly, the same for every conn: timeouts,
// resets and EOFs by name, and others without their addresses.
func reason(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "out of file descriptors"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no free local port"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.Is(err, io.EOF):
		return "EOF"
	}
	return addrRE.ReplaceAllString(err.Error(), "ADDR")
}

// closedEarly reports whether err is what a peer that closed the conn at
// once leaves: EOF or a reset.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// tally counts outcomes by name.
type tally struct {
	mu sync.Mutex
	m  map[string]int64
	// open counts what is held now; peak the most held at once.
	open, peak atomic.Int64
}

func (t *tally) add(k string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]int64{}
	}
	t.m[k] += n
}

func (t *tally) inc(k string) { t.add(k, 1) }

func (t *tally) get(k string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[k]
}

// hold counts one more open conn; the returned func counts it closed.
func (t *tally) hold() func() {
	n := t.open.Add(1)
	for {
		p := t.peak.Load()
		if n <= p || t.peak.CompareAndSwap(p, n) {
			break
		}
	}
	var once sync.Once
	return func() { once.Do(func() { t.open.Add(-1) }) }
}

// with returns the counts whose keys start with prefix, without it,
// most frequent first, as "n key" items.
func (t *tally) with(prefix string) []string { return t.items(prefix, len(prefix)) }

// whole is with, keeping the prefix in the keys.
func (t *tally) whole(prefix string) []string { return t.items(prefix, 0) }

// items returns the counts whose keys start with prefix, with the first cut
// bytes of their keys cut, most frequent first, as "n key" items.
func (t *tally) items(prefix string, cut int) []string {
	t.mu.Lock()
	type kv struct {
		k string
		n int64
	}
	var kvs []kv
	for k, n := range t.m {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			kvs = append(kvs, kv{k[cut:], n})
		}
	}
	t.mu.Unlock()
	sort.Slice(kvs, func(i, j int) bool {
		if kvs[i].n != kvs[j].n {
			return kvs[i].n > kvs[j].n
		}
		return kvs[i].k < kvs[j].k
	})
	out := make([]string, len(kvs))
	for i, e := range kvs {
		out[i] = fmt.Sprintf("%d %s", e.n, e.k)
	}
	return out
}
