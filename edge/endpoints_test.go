package edge

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tunnelkit/tunnelkit/router"
)

// TestEndpointsAsAMap: a session's endpoints answer as a map of them
// would, through random adds and removes, below and past the few that sit
// in a slice.
func TestEndpointsAsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var e endpoints
		model := map[string]*router.Route{}
		next := 0
		for op := range 200 {
			switch {
			case rng.IntN(3) > 0 && len(model) < 3*smallEndpoints:
				r := &router.Route{TunnelID: fmt.Sprint("t", next)}
				next++
				e.add(r)
				model[r.TunnelID] = r
			default:
				id := fmt.Sprint("t", rng.IntN(next+1)) // sometimes one never added, or gone
				got, ok := e.remove(id)
				want, wok := model[id]
				delete(model, id)
				if ok != wok || got != want {
					t.Fatalf("round %d, op %d: remove(%s) = %v, %v; want %v, %v", round, op, id, got, ok, want, wok)
				}
			}
			if e.len() != len(model) {
				t.Fatalf("round %d, op %d: len %d, want %d", round, op, e.len(), len(model))
			}
			for i := range next + 1 {
				id := fmt.Sprint("t", i)
				got, ok := e.get(id)
				want, wok := model[id]
				if ok != wok || got != want {
					t.Fatalf("round %d, op %d: get(%s) = %v, %v; want %v, %v", round, op, id, got, ok, want, wok)
				}
			}
		}
		var want []string
		for id := range model {
			want = append(want, id)
		}
		var got []string
		for _, r := range e.take() {
			got = append(got, r.TunnelID)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: take = %v, want %v", round, got, want)
		}
		if e.len() != 0 || e.few != nil || e.many != nil {
			t.Fatalf("round %d: after take, %d endpoints", round, e.len())
		}
	}
}
