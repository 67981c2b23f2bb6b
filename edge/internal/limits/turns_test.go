package limits

import (
	"sync"
	"testing"
	"time"
)

func TestTurnsInOrder(t *testing.T) {
	var tu Turns
	tu.SetMax(1)
	if !tu.Acquire(time.Time{}, nil) {
		t.Fatal("the first turn was not taken")
	}
	if tu.Acquire(time.Time{}, nil) {
		t.Fatal("a second turn was taken past the bound, without waiting")
	}
	// Waiters line up one by one, and are served in that order.
	const n = 5
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if tu.Acquire(time.Now().Add(time.Minute), nil) {
				order <- i
				tu.Release()
			}
		})
		for {
			if _, w := tu.Held(); w == i+1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	tu.Release()
	wg.Wait()
	close(order)
	next := 0
	for i := range order {
		if i != next {
			t.Fatalf("waiter %d went in turn %d", i, next)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d of %d waiters went", next, n)
	}
	if h, w := tu.Held(); h != 0 || w != 0 {
		t.Fatalf("held %d, waiting %d at the end; want 0, 0", h, w)
	}
}

func TestTurnsDeadlineAndStop(t *testing.T) {
	var tu Turns
	tu.SetMax(1)
	tu.Acquire(time.Time{}, nil)
	if tu.Acquire(time.Now().Add(20*time.Millisecond), nil) {
		t.Fatal("a turn was taken while the only one was held")
	}
	stop := make(chan struct{})
	done := make(chan bool)
	go func() { done <- tu.Acquire(time.Now().Add(time.Minute), stop) }()
	for {
		if _, w := tu.Held(); w == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	if <-done {
		t.Fatal("a waiter took a turn once stopped")
	}
	if h, w := tu.Held(); h != 1 || w != 0 {
		t.Fatalf("held %d, waiting %d; want 1, 0: those that gave up are gone from the line", h, w)
	}
	tu.Release()
	if h, _ := tu.Held(); h != 0 {
		t.Fatalf("held %d after the release", h)
	}
}

func TestTurnsSetMax(t *testing.T) {
	var tu Turns
	for range 2 {
		if !tu.Acquire(time.Time{}, nil) {
			t.Fatal("the zero value bounded turns")
		}
	}
	tu.SetMax(1) // two held past the new bound
	got := make(chan bool)
	go func() { got <- tu.Acquire(time.Now().Add(time.Minute), nil) }()
	for {
		if _, w := tu.Held(); w == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	tu.Release() // back to the bound: the waiter still waits
	select {
	case <-got:
		t.Fatal("a waiter went in while the bound was held")
	case <-time.After(20 * time.Millisecond):
	}
	tu.SetMax(2) // room for it now
	if !<-got {
		t.Fatal("the waiter did not go in once the bound grew")
	}
	if h, w := tu.Held(); h != 2 || w != 0 {
		t.Fatalf("held %d, waiting %d; want 2, 0", h, w)
	}
	tu.SetMax(0)
	if !tu.Acquire(time.Time{}, nil) {
		t.Fatal("no bound, and a turn was refused")
	}
}
