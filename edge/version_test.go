package edge_test

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// TestKeepAliveFollowsTheAgentsVersion says hello to the edge as agents of
// version 2, 3, 5 and 6 (and a newer one), raw, and reads the streams the
// edge opens: a version 2 agent gets a heartbeat stream, whose pings it
// must echo; a version 3 to 5 agent gets ping streams, each a time and the
// end, and never a heartbeat; an agent of wire.PingFrameVersion or later
// gets no stream, but PING frames, which its framer answers (it pings
// nothing of its own: the edge pings a silent agent).
// Each session answers as its version should and outlives twice the time
// the edge gives an agent it hears nothing from (HeartbeatInterval +
// HeartbeatTimeout); a newer agent than the edge is answered with the
// edge's own version. The timeout is 2 s, so that a test answering late
// on a busy machine is not taken for a dead agent; the pings it waits for
// come every 50 ms, however late.
func TestKeepAliveFollowsTheAgentsVersion(t *testing.T) {
	t.Parallel()
	const interval, timeout = 50 * time.Millisecond, 2 * time.Second
	te := edgeOn(t, &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{HeartbeatInterval: interval, HeartbeatTimeout: timeout}}, listen(t), listen(t))
	// The versions side by side, in this test's place among the parallel
	// tests: each waits out the same seconds.
	var wg sync.WaitGroup
	for _, v := range []int{wire.MinVersion, wire.PingVersion, wire.PingFrameVersion - 1, wire.PingFrameVersion, wire.Version + 1} {
		wg.Go(func() {
			t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
				keepAliveOfVersion(t, te, v, 2*(interval+timeout))
			})
		})
	}
	wg.Wait()
}

// keepAliveOfVersion says hello to te as an agent of version v, and reads
// and answers the streams the edge opens for at least watch, and until a
// version 3 agent had five pings.
func keepAliveOfVersion(t *testing.T, te *testEdge, v int, watch time.Duration) {
	var s interface {
		Open() (net.Conn, error)
		Accept() (net.Conn, error)
		Close() error
	}
	var heard func() uint64 // frames heard from the edge, with PING frames
	if v >= wire.PingFrameVersion {
		ws := rawWireSession(t, te.agentAddr)
		s, heard = ws, ws.Heard
	} else {
		s = rawSession(t, te.agentAddr)
	}
	st, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	st.Write(mustMessage(t, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: v}}))
	var resp wire.Response
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := wire.ReadMessage(st, &resp); err != nil || resp.HelloResp == nil {
		t.Fatalf("hello: %+v, %v", resp, err)
	}
	if got, want := resp.HelloResp.Version, min(v, wire.Version); got != want {
		t.Errorf("the edge answered version %d, want %d", got, want)
	}
	// The edge's streams. The version 3 agent pings nothing: the frames
	// that close the edge's ping streams are all the edge needs to hear.
	type accepted struct {
		st  io.ReadWriteCloser
		err error
	}
	streams := make(chan accepted, 100)
	go func() {
		for {
			st, err := s.Accept()
			streams <- accepted{st, err}
			if err != nil {
				return
			}
		}
	}()
	pings, heartbeats := 0, 0
	watched := time.After(watch)
	bound := time.After(watch + time.Minute) // only a failing test waits for it
	heard0 := uint64(0)
	if heard != nil {
		heard0 = heard()
	}
	enough := func() bool {
		switch {
		case v < wire.PingVersion:
			return true
		case v >= wire.PingFrameVersion:
			return heard()-heard0 >= 5
		}
		return pings >= 5
	}
read:
	for {
		var a accepted
		select {
		case a = <-streams:
		case <-watched:
			watched = nil
			if enough() {
				break read
			}
			continue
		case <-bound:
			t.Fatalf("%d pings and %d heartbeat streams in %v", pings, heartbeats, watch+time.Minute)
		}
		if a.err != nil {
			t.Fatalf("the edge ended the session after %d pings and %d heartbeats: %v", pings, heartbeats, a.err)
		}
		var typ [1]byte
		io.ReadFull(a.st, typ[:])
		switch wire.StreamType(typ[0]) {
		case wire.StreamPing:
			pings++
			if err := wire.ReadPing(a.st); err != nil {
				t.Errorf("a ping stream: %v", err)
			}
			if n, err := a.st.Read(typ[:]); n != 0 || err != io.EOF {
				t.Errorf("a ping stream goes on after its time: %d bytes, %v", n, err)
			}
			a.st.Close()
		case wire.StreamHeartbeat:
			heartbeats++
			go func() { io.Copy(a.st, a.st); a.st.Close() }()
		default:
			t.Errorf("a stream of type %d", typ[0])
		}
		if watched == nil && enough() {
			break read
		}
	}
	if v < wire.PingVersion && (heartbeats != 1 || pings != 0) {
		t.Errorf("%d heartbeat streams and %d ping streams, want one heartbeat stream", heartbeats, pings)
	}
	if v >= wire.PingVersion && v < wire.PingFrameVersion && (heartbeats != 0 || pings < 5) {
		t.Errorf("%d heartbeat streams and %d ping streams, want pings only", heartbeats, pings)
	}
	if v >= wire.PingFrameVersion && (heartbeats != 0 || pings != 0 || heard()-heard0 < 5) {
		t.Errorf("%d heartbeat streams, %d ping streams and %d frames heard, want PING frames only", heartbeats, pings, heard()-heard0)
	}
	s.Close()
}
