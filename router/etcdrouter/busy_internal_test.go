package etcdrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestBusyRetry: a setup step that etcd answers "too many requests" (as
// the client converts its gRPC status) is tried again until it succeeds;
// one that fails otherwise fails at once; and the retries end with ctx.
func TestBusyRetry(t *testing.T) {
	tooMany := fmt.Errorf("etcdrouter: grant lease: %w", rpctypes.Error(rpctypes.ErrGRPCRequestTooManyRequests))
	if !busy(tooMany) || !busy(rpctypes.Error(rpctypes.ErrGRPCTimeout)) {
		t.Fatal("etcd's too many requests and request timed out are not taken for busy")
	}
	if busy(rpctypes.Error(rpctypes.ErrGRPCPermissionDenied)) || busy(errors.New("other")) {
		t.Fatal("a permission denied, or another error, is taken for busy")
	}
	log := slog.New(slog.DiscardHandler)
	calls := 0
	err := busyRetry(context.Background(), log, "a step", func() error {
		if calls++; calls < 3 {
			return tooMany
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("busy twice, then fine: %v after %d calls, want nil after 3", err, calls)
	}
	calls = 0
	denied := rpctypes.Error(rpctypes.ErrGRPCPermissionDenied)
	if err := busyRetry(context.Background(), log, "a step", func() error { calls++; return denied }); !errors.Is(err, denied) || calls != 1 {
		t.Fatalf("permission denied: %v after %d calls, want it after 1", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := busyRetry(ctx, log, "a step", func() error { return tooMany }); !errors.Is(err, rpctypes.ErrTooManyRequests) {
		t.Fatalf("busy until ctx ended: %v, want etcd's too many requests", err)
	}
}
