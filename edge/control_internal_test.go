package edge

import (
	"fmt"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// TestControlTurns: a session serves at most maxControl control requests
// at once; the next waits for one to end, and gives up when the session
// ends.
func TestControlTurns(t *testing.T) {
	ss := &session{done: make(chan struct{})}
	for i := range maxControl {
		if !ss.enterControl() {
			t.Fatalf("request %d found no turn", i)
		}
	}
	entered := make(chan bool, 2)
	go func() { entered <- ss.enterControl() }()
	go func() { entered <- ss.enterControl() }()
	select {
	case <-entered:
		t.Fatalf("a request past the %d served at once entered", maxControl)
	case <-time.After(50 * time.Millisecond):
	}
	ss.leaveControl()
	select {
	case ok := <-entered:
		if !ok {
			t.Fatal("the request waiting was refused a turn that ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a turn ended, and the request waiting never entered")
	}
	select {
	case <-entered:
		t.Fatal("two requests entered for one turn that ended")
	case <-time.After(50 * time.Millisecond):
	}
	close(ss.done)
	select {
	case ok := <-entered:
		if ok {
			t.Fatal("a request entered a session that ended, with no turn free")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session ended, and the request waiting never gave up")
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.controls != maxControl {
		t.Fatalf("%d turns counted, want %d", ss.controls, maxControl)
	}
}

// TestEndpointOptionVerboseErrors: the bind option verbose_errors sets
// the route's VerboseErrors for "true", not for "false", and is refused
// with any other value, and for tls and tcp endpoints, which have no
// error pages.
func TestEndpointOptionVerboseErrors(t *testing.T) {
	s := &Server{Domain: "example.test"}
	s.init()
	for _, tc := range []struct {
		proto, value string
		want         string // VerboseErrors, or the error
	}{
		{wire.ProtoHTTP, "true", "true"},
		{wire.ProtoHTTPS, "true", "true"},
		{wire.ProtoHTTP, "false", "false"},
		{wire.ProtoHTTP, "yes", `option verbose_errors: "yes": want true or false`},
		{wire.ProtoTLS, "true", "option verbose_errors is for http and https endpoints"},
		{wire.ProtoTCP, "true", "option verbose_errors is for http and https endpoints"},
	} {
		r := router.Route{Proto: tc.proto, Name: "app.example.test"}
		var got string
		if err := s.endpointOptions(&r, map[string]string{wire.OptVerboseErrors: tc.value}, nil); err != nil {
			got = err.Error()
		} else {
			got = fmt.Sprint(r.VerboseErrors)
		}
		if got != tc.want {
			t.Errorf("%s %s: %s; want %s", tc.proto, tc.value, got, tc.want)
		}
	}
}
