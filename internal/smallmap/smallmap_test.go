package smallmap

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// TestAsAMap: a Map answers as a Go map does, through random sets,
// replacements and deletes, below Few entries and past them.
func TestAsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 100 {
		var m Map[int, int]
		model := map[int]int{}
		keys := 1 + rng.IntN(4*Few) // how many keys this round draws from
		for op := range 300 {
			k := rng.IntN(keys)
			switch rng.IntN(3) {
			case 0, 1:
				m.Set(k, op)
				model[k] = op
			case 2:
				got, ok := m.Delete(k)
				want, wok := model[k]
				delete(model, k)
				if ok != wok || got != want {
					t.Fatalf("round %d, op %d: Delete(%d) = %d, %v; want %d, %v", round, op, k, got, ok, want, wok)
				}
			}
			if m.Len() != len(model) {
				t.Fatalf("round %d, op %d: Len %d, want %d", round, op, m.Len(), len(model))
			}
			for k := range keys {
				got, ok := m.Get(k)
				want, wok := model[k]
				if ok != wok || got != want {
					t.Fatalf("round %d, op %d: Get(%d) = %d, %v; want %d, %v", round, op, k, got, ok, want, wok)
				}
			}
		}
		if got := maps.Collect(m.All()); !maps.Equal(got, model) {
			t.Fatalf("round %d: All yields %v, want %v", round, got, model)
		}
		m.Clear()
		if m.Len() != 0 || m.few != nil || m.many != nil {
			t.Fatalf("round %d: %d entries after Clear", round, m.Len())
		}
	}
}

// TestEmptiedHoldsNothing: a Map whose entries were all deleted, while it
// kept them in a slice, holds no memory.
func TestEmptiedHoldsNothing(t *testing.T) {
	var m Map[string, *int]
	m.Set("a", new(int))
	m.Set("b", new(int))
	m.Delete("a")
	m.Delete("b")
	if m.few != nil {
		t.Errorf("an emptied Map holds a slice of %d", cap(m.few))
	}
}

func TestAllStops(t *testing.T) {
	for _, n := range []int{Few, 2 * Few} {
		var m Map[int, int]
		for i := range n {
			m.Set(i, i)
		}
		seen := 0
		for range m.All() {
			seen++
			if seen == 3 {
				break
			}
		}
		if seen != 3 {
			t.Errorf("%d entries: the loop saw %d, want 3 before its break", n, seen)
		}
	}
}
