package limits

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestBindGuardConcurrentBindsWaitInTurn: binds of an owner in debt that
// are under way at once wait one after the other, a PerSecond, rather
// than all for the same time: with one failure of debt at one a second
// and 1.5 s to wait, one of five binds gets through and four are
// throttled at once.
func TestBindGuardConcurrentBindsWaitInTurn(t *testing.T) {
	g := &BindGuard{PerSecond: 1, Burst: 1}
	g.Failed("mallory") // the burst spent: the next bind waits a second
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed, throttled := 0, 0
	for range 5 {
		wg.Go(func() {
			p, waited, err := g.Wait(ctx, "mallory")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrBindThrottled):
				throttled++
			case err == nil && waited:
				passed++
				p.Done(true)
			default:
				t.Errorf("Wait: waited %v, %v", waited, err)
			}
		})
	}
	wg.Wait()
	if passed != 1 || throttled != 4 {
		t.Errorf("%d binds passed and %d were throttled; want 1 and 4", passed, throttled)
	}
}

// TestBindGuardSuccessGivesBack: a bind that waited and succeeded gives
// back what its wait reserved; one that failed keeps it as debt.
func TestBindGuardSuccessGivesBack(t *testing.T) {
	g := &BindGuard{PerSecond: 1, Burst: 1}
	g.Failed("alice")
	p, _, err := g.Wait(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	p.Done(false)
	// The wait took its second, which paid the debt; the success gave
	// back the token it reserved (kept, it would leave about none).
	if after := g.tokensLocked(g.owners["alice"], time.Now()); after < 0.9 {
		t.Errorf("tokens %.2f after a success: the success was charged", after)
	}
	p, _, err = g.Wait(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	p.Done(true)
	if after := g.tokensLocked(g.owners["alice"], time.Now()); after >= 0.5 {
		t.Errorf("tokens %.2f after a failure: want the token spent", after)
	}
	var none Pass
	none.Done(true) // the zero Pass of a nil guard: nothing
}
