package wire

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"
)

// BenchmarkMuxadoIdleSession measures what an idle muxado v2.0.2 session
// costs by itself: bare muxado.Server and muxado.Client pairs, stock
// framer and settings, none of this package's code. Both ends are in this
// process, alike: the figures are per end. It runs 1000 pairs per op over
// net.Pipe and over loopback TCP, idle from the start ("fresh") and after
// one stream each way ("used"); the heap of the transports themselves is
// not counted. Run it with -benchtime 1x:
//
//	go test ./internal/wire -run '^$' -bench MuxadoIdle -benchtime 1x
//
// On go1.26 amd64, an end costs 11.8 KB of heap over TCP (13.2 KB over
// net.Pipe, where its two goroutines' structures, 450 B each, are new
// rather than reused), and 2 goroutines whose stacks take 4.6 KB fresh,
// 8.2 KB once used. Where it goes (BenchmarkMuxadoParts measures the
// parts alone), and what only a change to muxado would lift:
//
//   - 6.6 KB: the stream map, made with a capacity hint of 128
//     (stream_map.go, initMapCapacity). With no hint it costs 48 B at
//     rest, and 256 B from its first stream until it has eight.
//   - 2.4 KB: the accept queue, a channel of AcceptBacklog (default 128)
//     stream interfaces made up front: 368 B for 16, 18.5 KB for 1024. A
//     caller may lower it, at the risk of resets in a burst of streams;
//     a queue grown on demand would cost nothing at rest.
//   - 1.9 KB: the writer's queue, a channel of 64 requests
//     (Config.writeFrameQueueDepth, unexported). The writer writes one
//     frame at a time; a depth of 4 costs 208 B.
//   - The stacks of the reader and the writer, 2 KiB each while fresh. The
//     reader's grows to 4 KiB handling the first SYN (handleFrame and
//     handleSyn hold 650 B of locals, mostly for their cold paths: GOAWAY
//     handling, fmt.Errorf), and a stack never shrinks back from 4 KiB to
//     2 KiB once its goroutine waits in a read (the runtime shrinks a
//     stack only when less than a quarter is in use, counting an 800 B
//     guard). With the cold paths out of line (tried on a local copy: 120
//     B of locals left), a used session's stacks took 6.5 KB, not 8.2.
func BenchmarkMuxadoIdleSession(b *testing.B) {
	const pairs = 1000
	for _, tr := range []transport{
		{"pipe", func(t testing.TB) (net.Conn, net.Conn) { return net.Pipe() }},
		{"tcp", tcpPair},
	} {
		for _, used := range []bool{false, true} {
			name := tr.name + "/fresh"
			if used {
				name = tr.name + "/used"
			}
			b.Run(name, func(b *testing.B) {
				var heap, stack, goroutines float64
				for range b.N {
					h, s, g := measureMuxadoSessions(b, tr, pairs, used)
					heap += h
					stack += s
					goroutines += g
				}
				n := float64(b.N * 2 * pairs)
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(heap/n, "heap-B/session")
				b.ReportMetric(stack/n, "stack-B/session")
				b.ReportMetric(goroutines/n, "goroutines/session")
			})
		}
	}
}

// measureMuxadoSessions opens pairs muxado session pairs over fresh
// transports and returns the heap, stack and goroutines they hold, over
// the transports' own.
func measureMuxadoSessions(b *testing.B, tr transport, pairs int, used bool) (heap, stack, goroutines float64) {
	conns := make([][2]net.Conn, pairs)
	for i := range conns {
		conns[i][0], conns[i][1] = tr.conns(b)
	}
	before, g0 := memStatsAfterGC()
	sessions := make([]muxado.Session, 0, 2*pairs)
	for _, c := range conns {
		sessions = append(sessions, muxado.Server(c[0], nil), muxado.Client(c[1], nil))
	}
	defer func() {
		for _, s := range sessions {
			s.Close()
		}
	}()
	if used {
		for i := 0; i < len(sessions); i += 2 {
			if err := oneStreamEachWay(sessions[i], sessions[i+1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	after, g1 := memStatsAfterGC()
	return float64(after.HeapAlloc) - float64(before.HeapAlloc),
		float64(after.StackInuse) - float64(before.StackInuse),
		float64(g1 - g0)
}

// oneStreamEachWay opens a stream from each end of a pair, sends a byte
// on it and closes it, as the other end reads it and closes it too.
func oneStreamEachWay(a, b muxado.Session) error {
	for _, p := range [][2]muxado.Session{{a, b}, {b, a}} {
		from, to := p[0], p[1]
		st, err := from.OpenStream()
		if err != nil {
			return err
		}
		if _, err := st.Write([]byte{1}); err != nil {
			return err
		}
		st.CloseWrite()
		in, err := to.AcceptStream()
		if err != nil {
			return err
		}
		in.SetDeadline(time.Now().Add(time.Minute))
		if _, err := io.ReadAll(in); err != nil {
			return err
		}
		in.Close()
		st.Close()
	}
	return nil
}

func memStatsAfterGC() (runtime.MemStats, int) {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m, runtime.NumGoroutine()
}

// BenchmarkMuxadoParts measures, by themselves, the allocations an idle
// muxado session makes up front that a change to muxado would shrink:
// its stream map as made (capacity hint 128) and with no hint, its accept
// queue (AcceptBacklog stream interfaces: 128 by default), and its writer's
// queue (64 requests of a frame and an error channel).
//
//	go test ./internal/wire -run '^$' -bench MuxadoParts -benchtime 1x
func BenchmarkMuxadoParts(b *testing.B) {
	const n = 1000
	type streamPrivate interface{ Close() error } // an interface, as muxado's
	type writeReq struct {
		f   io.Writer // an interface, as frame.Frame
		err chan error
	}
	parts := []struct {
		name string
		make func() any
	}{
		{"streammap-hint128", func() any { return make(map[uint32]streamPrivate, 128) }},
		{"streammap-hint0", func() any { return make(map[uint32]streamPrivate) }},
		{"streammap-hint0-1stream", func() any {
			m := make(map[uint32]streamPrivate)
			m[1] = nil
			return m
		}},
		{"acceptqueue-128", func() any { return make(chan streamPrivate, 128) }},
		{"acceptqueue-16", func() any { return make(chan streamPrivate, 16) }},
		{"acceptqueue-1024", func() any { return make(chan streamPrivate, 1024) }},
		{"writequeue-64", func() any {
			c := make(chan writeReq, 64)
			c <- writeReq{f: io.Discard, err: nil} // its fields are muxado's
			<-c
			return c
		}},
		{"writequeue-4", func() any { return make(chan writeReq, 4) }},
	}
	for _, p := range parts {
		b.Run(p.name, func(b *testing.B) {
			var total float64
			for range b.N {
				keep := make([]any, n)
				before, _ := memStatsAfterGC()
				for i := range keep {
					keep[i] = p.make()
				}
				after, _ := memStatsAfterGC()
				total += float64(after.HeapAlloc) - float64(before.HeapAlloc)
				runtime.KeepAlive(keep)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(total/float64(b.N*n), "B/each")
		})
	}
}
