package policies

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/policy"
)

// TestRenew: after Renew, a held policy keeps its holds and is compiled
// again at its next Get, once for all its callers; one the edge does not
// hold goes; a compile that fails is the Get's error, and the hold stays.
func TestRenew(t *testing.T) {
	ps := &Cache{Retry: time.Minute, Timeout: time.Minute}
	held := Key{Endpoint: names.Endpoint{Proto: "http", Name: "a.example.test"}, Identity: "alice"}
	other := Key{Endpoint: names.Endpoint{Proto: "http", Name: "b.example.test"}, Identity: "bob"}
	first := &policy.Policy{}
	ps.Hold(held, first)
	var compiles atomic.Int32
	var fail atomic.Bool
	second := &policy.Policy{}
	compile := func(context.Context) (*policy.Policy, error) {
		compiles.Add(1)
		if fail.Load() {
			return nil, errors.New("the operator's new policy refuses it")
		}
		return second, nil
	}
	if cp, err := ps.Get(context.Background(), held, compile); err != nil || cp.Policy() != first || compiles.Load() != 0 {
		t.Fatalf("the held policy before Renew: %v, %v, %d compiles", cp.Policy(), err, compiles.Load())
	}
	if _, err := ps.Get(context.Background(), other, compile); err != nil || compiles.Load() != 1 {
		t.Fatalf("another endpoint's: %v, %d compiles", err, compiles.Load())
	}
	ps.Renew()
	if ps.Len() != 1 {
		t.Fatalf("after Renew: %d kept, want the held one alone", ps.Len())
	}
	for range 3 {
		if cp, err := ps.Get(context.Background(), held, compile); err != nil || cp.Policy() != second {
			t.Fatalf("the held policy after Renew: %v, %v", cp.Policy(), err)
		}
	}
	if compiles.Load() != 2 {
		t.Errorf("%d compiles, want 2: one before Renew, one after", compiles.Load())
	}
	ps.Renew()
	fail.Store(true)
	if _, err := ps.Get(context.Background(), held, compile); err == nil {
		t.Error("a policy that does not compile after Renew: no error")
	}
	// The hold stays: its Release drops it.
	ps.Release(held)
	if ps.Len() != 0 {
		t.Errorf("after the last Release: %d kept", ps.Len())
	}
}
