package edge_test

import (
	"io"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// TestKeepAliveFollowsTheAgentsVersion says hello to the edge as agents of
// version 2 and 3, raw, and reads the streams the edge opens: a version 2
// agent gets a heartbeat stream, whose pings it must echo; a version 3
// agent gets ping streams, each a time and the end, and never a heartbeat.
// Each session answers as its version should and outlives many heartbeat
// timeouts; a newer agent than the edge is answered with the edge's own
// version.
func TestKeepAliveFollowsTheAgentsVersion(t *testing.T) {
	t.Parallel()
	const interval, timeout = 30 * time.Millisecond, 200 * time.Millisecond
	te := edgeOn(t, &edge.Server{Domain: "example.test", Timeouts: edge.Timeouts{HeartbeatInterval: interval, HeartbeatTimeout: timeout}}, listen(t), listen(t))
	for _, v := range []int{wire.MinVersion, wire.PingVersion, wire.Version + 1} {
		s := rawSession(t, te.agentAddr)
		st, err := s.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		st.Write(mustMessage(t, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: v}}))
		var resp wire.Response
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := wire.ReadMessage(st, &resp); err != nil || resp.HelloResp == nil {
			t.Fatalf("version %d: hello: %+v, %v", v, resp, err)
		}
		if got, want := resp.HelloResp.Version, min(v, wire.Version); got != want {
			t.Errorf("version %d: the edge answered version %d, want %d", v, got, want)
		}
		// The edge's streams, for eight timeouts. The version 3 agent pings
		// nothing: the frames that close the edge's ping streams are all
		// the edge needs to hear.
		type accepted struct {
			st  io.ReadWriteCloser
			err error
		}
		streams := make(chan accepted, 100)
		go func() {
			for {
				st, err := s.AcceptStream()
				streams <- accepted{st, err}
				if err != nil {
					return
				}
			}
		}()
		pings, heartbeats := 0, 0
		done := time.After(8 * timeout)
	read:
		for {
			var a accepted
			select {
			case a = <-streams:
			case <-done:
				break read
			}
			if a.err != nil {
				t.Fatalf("version %d: the edge ended the session after %d pings and %d heartbeats: %v", v, pings, heartbeats, a.err)
			}
			var typ [1]byte
			io.ReadFull(a.st, typ[:])
			switch wire.StreamType(typ[0]) {
			case wire.StreamPing:
				pings++
				if err := wire.ReadPing(a.st); err != nil {
					t.Errorf("version %d: a ping stream: %v", v, err)
				}
				if n, err := a.st.Read(typ[:]); n != 0 || err != io.EOF {
					t.Errorf("version %d: a ping stream goes on after its time: %d bytes, %v", v, n, err)
				}
				a.st.Close()
			case wire.StreamHeartbeat:
				heartbeats++
				go func() { io.Copy(a.st, a.st); a.st.Close() }()
			default:
				t.Errorf("version %d: a stream of type %d", v, typ[0])
			}
		}
		if v < wire.PingVersion && (heartbeats != 1 || pings != 0) {
			t.Errorf("version %d: %d heartbeat streams and %d ping streams, want one heartbeat stream", v, heartbeats, pings)
		}
		if v >= wire.PingVersion && (heartbeats != 0 || pings < 5) {
			t.Errorf("version %d: %d heartbeat streams and %d ping streams, want pings only", v, heartbeats, pings)
		}
		s.Close()
	}
}
