package router

import (
	"context"
	"errors"
	"strings"
)

// Move binds r in rt in the place of the routes of r.Proto and r.Name that
// the session from holds, as an edge does for an agent whose session
// ticket names its previous session (which may live on another edge that
// has not seen the agent go, or that asked it to move): with rt's own Move
// when rt is a Mover, in one step; otherwise with Bind and, when the name
// is taken by such routes of r.Identity alone, by unbinding them and
// binding r again, in two steps, between which a lookup finds no route.
// With from empty, it is Bind.
func Move(ctx context.Context, rt Router, r Route, from string) error {
	if m, ok := rt.(Mover); ok && from != "" {
		return m.Move(ctx, r, from)
	}
	err := rt.Bind(ctx, r)
	if from == "" || !errors.Is(err, ErrNameTaken) {
		return err
	}
	routes, lerr := rt.Lookup(ctx, r.Proto, strings.TrimPrefix(r.Name, "*."))
	var mine []Route
	for _, o := range routes {
		if o.Name != r.Name {
			continue
		}
		if o.Identity != r.Identity || o.SessionID != from {
			return err
		}
		mine = append(mine, o)
	}
	if lerr != nil || len(mine) == 0 {
		return err
	}
	for _, o := range mine {
		if uerr := rt.Unbind(ctx, o, 0); uerr != nil {
			return err
		}
	}
	return rt.Bind(ctx, r)
}
