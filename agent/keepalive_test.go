package agent_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testproxy"
)

// TestHeartbeatThroughIdleProxy runs two agents, each with an edge of its
// own, through one tinyproxy that closes connections idle for 3 s. The
// first pings every 500 ms, and so does its edge: its session must outlive
// the control's. The control pings every hour, as does its edge: the
// proxy drops its idle session (the event the test waits for, three times
// over, 9 s or more), which shows the proxy really drops idle sessions.
func TestHeartbeatThroughIdleProxy(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("idles for 9 s or more")
	}
	kept := startProxyEdge(t, proxyEdgeConfig{onlyFrom: testproxy.Out, heartbeat: 500 * time.Millisecond})
	control := startProxyEdge(t, proxyEdgeConfig{onlyFrom: testproxy.Out, heartbeat: time.Hour})
	p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{Timeout: 3 * time.Second, ConnectPorts: []int{kept.agentPort, control.agentPort}})

	events := func() (chan agent.Event, func(agent.Event)) {
		ch := make(chan agent.Event, 100)
		return ch, func(e agent.Event) {
			select {
			case ch <- e:
			default:
			}
		}
	}
	keptEvents, onKept := events()
	kc := &agent.Client{Addrs: []string{kept.agentAddr}, Proxy: agent.ProxyURL(p.URL), HeartbeatInterval: 500 * time.Millisecond, OnEvent: onKept}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kl, err := kc.Listen(ctx, "http://kept")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(kl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "still here") }))

	controlEvents, onControl := events()
	cc := &agent.Client{Addrs: []string{control.agentAddr}, Proxy: agent.ProxyURL(p.URL), HeartbeatInterval: time.Hour, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, OnEvent: onControl}
	defer cc.Close()
	if _, err := cc.Listen(ctx, "http://control"); err != nil {
		t.Fatal(err)
	}

	// Each drop of the control's session is 3 s of idling or more, which the
	// kept session, older, has idled through too (but for its pings).
	bound := time.After(90 * time.Second)
	for drops := 0; drops < 3; {
		select {
		case ev := <-controlEvents:
			if ev.Kind == agent.Disconnected {
				drops++
				t.Logf("control session dropped (%d): %v", drops, ev.Err)
			}
		case ev := <-keptEvents:
			if ev.Kind != agent.Connected {
				t.Fatalf("the kept session: %v (%v)", ev.Kind, ev.Err)
			}
		case <-bound:
			t.Fatalf("the proxy did not drop the control's idle session 3 times in 90 s; its log:\n%s", p.Log())
		}
	}
	if !strings.Contains(p.Log(), "Idle Timeout") {
		t.Errorf("tinyproxy's log shows no idle timeout:\n%s", p.Log())
	}

	// The kept session is the one it opened, and serves.
	for len(keptEvents) > 0 {
		if ev := <-keptEvents; ev.Kind != agent.Connected {
			t.Errorf("the kept session: %v (%v)", ev.Kind, ev.Err)
		}
	}
	if peers, _ := kept.agents.seen(); len(peers) != 1 {
		t.Errorf("the kept edge saw %d sessions (%v), want 1", len(peers), peers)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+kept.httpAddr+"/", nil)
	req.Host = "kept.example.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "still here" {
		t.Errorf("after idling: %d %q", resp.StatusCode, body)
	}
}
