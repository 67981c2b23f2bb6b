package forward

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/tunnelkit/tunnelkit/agent/inspect"
)

var _ inspect.Replayer = (*httpProxy)(nil)

// Replay serves r, a request an Inspector replays, as a request from the
// edge, and discards the response, which the inspector records. It ends
// when Serve returns, if it has not before.
func (p *httpProxy) Replay(r *http.Request) (err error) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v != http.ErrAbortHandler {
			panic(v)
		}
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			err = fmt.Errorf("forward: the forwarder to %s has stopped: %w", p.to, http.ErrServerClosed)
		} else {
			err = errors.New("forward: the response broke off")
		}
	}()
	p.ServeHTTP(&replayWriter{}, r.WithContext(ctx))
	return nil
}

// replayWriter is the ResponseWriter of a replay: it discards the
// response, which the inspector has seen.
type replayWriter struct{ h http.Header }

func (w *replayWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}

func (w *replayWriter) WriteHeader(int) {}

func (w *replayWriter) Write(b []byte) (int, error) { return len(b), nil }
