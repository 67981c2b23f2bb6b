package agent

import (
	"context"
	"fmt"
	"runtime"
	"sync"
)

// The TLS handshakes of a process's Clients take turns: at most
// handshakeTurns of them are under way at once, and the others wait in
// line, in the order they came (a session's attempt before its time
// begins: see connect). A process that holds thousands of Clients (a
// connector, a fleet simulated on one host) whose edge died has them all
// reconnect at once: with no bound, each handshake gets a thousandth of
// the CPU and every one of them takes longer than its attempt may
// (edgeTimeout), so that none gets through however long they try; in
// turn, the first are done in milliseconds. One Client alone never
// waits.
var handshakeTurns = make(chan struct{}, max(64, 16*runtime.GOMAXPROCS(0)))

// takeTurn waits for a turn at a TLS handshake within ctx, and returns the
// func that gives it back. A session's attempt waits for it before its
// time (edgeTimeout) begins (connect); a move's, within its time.
func takeTurn(ctx context.Context) (release func(), err error) {
	select {
	case handshakeTurns <- struct{}{}:
		return func() { <-handshakeTurns }, nil
	default:
	}
	select {
	case handshakeTurns <- struct{}{}:
		return func() { <-handshakeTurns }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("agent: %d TLS handshakes of this process's clients were under way until the attempt's end: %w", cap(handshakeTurns), ctxErr(ctx, ctx.Err()))
	}
}

// heldTurn is a turn that connect took before its attempt's time began,
// which reach gives back once its TLS handshake is done (or connect, at
// its end, if reach did not).
type heldTurn struct {
	once    sync.Once
	release func()
}

func (t *heldTurn) done() { t.once.Do(t.release) }

// heldTurnKey is the context key of a heldTurn.
type heldTurnKey struct{}
