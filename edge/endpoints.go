package edge

import "github.com/tunnelkit/tunnelkit/router"

// endpoints are the endpoints bound on a session, by tunnel ID. Most
// sessions bind one or a few, for as long as they last: those sit in a
// slice (a map of one costs an idle session 300 B); past smallEndpoints,
// in a map. The zero value holds none.
type endpoints struct {
	few  []*router.Route
	many map[string]*router.Route // set once there were more than smallEndpoints; few is nil then
}

// smallEndpoints is how many endpoints a session holds in a slice.
const smallEndpoints = 8

func (e *endpoints) len() int {
	if e.many != nil {
		return len(e.many)
	}
	return len(e.few)
}

func (e *endpoints) get(tunnelID string) (*router.Route, bool) {
	if e.many != nil {
		r, ok := e.many[tunnelID]
		return r, ok
	}
	for _, r := range e.few {
		if r.TunnelID == tunnelID {
			return r, true
		}
	}
	return nil, false
}

// add adds r, whose tunnel ID is new.
func (e *endpoints) add(r *router.Route) {
	switch {
	case e.many != nil:
		e.many[r.TunnelID] = r
	case len(e.few) < smallEndpoints:
		e.few = append(e.few, r)
	default:
		e.many = make(map[string]*router.Route, len(e.few)+1)
		for _, f := range e.few {
			e.many[f.TunnelID] = f
		}
		e.many[r.TunnelID] = r
		e.few = nil
	}
}

// remove removes the endpoint of tunnelID and returns it.
func (e *endpoints) remove(tunnelID string) (*router.Route, bool) {
	if e.many != nil {
		r, ok := e.many[tunnelID]
		delete(e.many, tunnelID)
		return r, ok
	}
	for i, r := range e.few {
		if r.TunnelID == tunnelID {
			last := len(e.few) - 1
			e.few[i] = e.few[last]
			e.few[last] = nil
			e.few = e.few[:last]
			return r, true
		}
	}
	return nil, false
}

// take removes all the endpoints and returns them.
func (e *endpoints) take() []*router.Route {
	all := e.few
	for _, r := range e.many {
		all = append(all, r)
	}
	*e = endpoints{}
	return all
}
