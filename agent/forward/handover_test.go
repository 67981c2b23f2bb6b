package forward_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/forward"
)

// handingListener is a loopback listener whose Accept fails with
// forward.ErrHandedOver once handOver is called.
type handingListener struct {
	net.Listener
	once   sync.Once
	handed chan struct{}
}

func (l *handingListener) handOver() {
	l.once.Do(func() { close(l.handed) })
}

func (l *handingListener) Accept() (net.Conn, error) {
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Listener.Accept()
		ch <- accepted{c, err}
	}()
	select {
	case a := <-ch:
		return a.c, a.err
	case <-l.handed:
		l.Listener.Close() // the goroutine above returns
		return nil, fmt.Errorf("handing over: %w", forward.ErrHandedOver)
	}
}

// TestServeHandedOver: a forwarder whose listener is handed over takes no
// more conns and closes none of those it serves: a download under way
// ends whole, over HTTP and over Bytes, and Serve returns nil once it has.
func TestServeHandedOver(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	app := serveApp(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		io.CopyN(w, zeros{}, size)
	}), false)
	for _, f := range []struct {
		name string
		fwd  server
	}{
		{"HTTP", forward.HTTP{To: app}},
		{"Bytes", forward.Bytes{To: app}},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			ln := &handingListener{Listener: listenLoopback(t), handed: make(chan struct{})}
			served := make(chan error, 1)
			go func() { served <- f.fwd.Serve(ln) }()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			ln.handOver()
			select {
			case err := <-served:
				t.Fatalf("Serve returned (%v) with a download under way", err)
			case <-time.After(100 * time.Millisecond):
			}
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != size {
				t.Fatalf("download across the hand-over: %d bytes, %v; want %d", n, err, size)
			}
			c.Close()
			if err := <-served; err != nil {
				t.Errorf("Serve after the hand-over: %v, want nil", err)
			}
		})
	}
}

// zeros reads as zero bytes, for ever.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
