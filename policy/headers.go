package policy

import (
	"net/http"
	"slices"
	"strings"
)

// headerOps is a compiled Headers: canonical names to remove, and values to
// set, each a slice with no spare capacity, shared by every request, so
// that applying them allocates nothing (a later append copies).
type headerOps struct {
	remove []string
	set    []headerSet
}

type headerSet struct {
	name   string
	values []string
}

func newHeaderOps(h *Headers) *headerOps {
	if h == nil {
		return nil
	}
	ops := new(headerOps)
	for _, name := range h.Remove {
		ops.remove = append(ops.remove, http.CanonicalHeaderKey(name))
	}
	byName := map[string]int{}
	for _, a := range h.Add {
		name, value, _ := strings.Cut(a, ":")
		name = http.CanonicalHeaderKey(name)
		value = strings.TrimSpace(value)
		i, ok := byName[name]
		if !ok {
			i = len(ops.set)
			byName[name] = i
			ops.set = append(ops.set, headerSet{name: name})
		}
		ops.set[i].values = append(ops.set[i].values, value)
	}
	for i := range ops.set {
		ops.set[i].values = slices.Clip(ops.set[i].values)
	}
	return ops
}

// apply removes, then sets.
func (ops *headerOps) apply(h http.Header) {
	if ops == nil {
		return
	}
	for _, name := range ops.remove {
		delete(h, name)
	}
	for _, s := range ops.set {
		h[s.name] = s.values
	}
}

// stripReserved removes every header whose name starts with ReservedPrefix,
// in any case (a client may send names that are not canonical through
// HTTP/2 or a hand-made http.Header).
func stripReserved(h http.Header) {
	for name := range h {
		if len(name) >= len(ReservedPrefix) && strings.EqualFold(name[:len(ReservedPrefix)], ReservedPrefix) {
			delete(h, name)
		}
	}
}
