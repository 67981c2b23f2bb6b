// Package smallmap is a map for the many small sets that live as long as
// an idle session: a Go map of one entry costs a few hundred bytes (a
// group of eight slots, and its header), where a slice of one costs the
// entry. A Map holds up to Few entries in a slice, searched in order, and
// moves them into a map when one more comes.
package smallmap

import "iter"

// Few is how many entries a Map holds in a slice.
const Few = 8

// Map maps keys to values. The zero value is empty and ready to use. A
// Map is not safe for concurrent use.
type Map[K comparable, V any] struct {
	few  []entry[K, V]
	many map[K]V // set once there were more than Few entries; few is nil then
}

type entry[K comparable, V any] struct {
	k K
	v V
}

// Len returns how many entries m holds.
func (m *Map[K, V]) Len() int {
	if m.many != nil {
		return len(m.many)
	}
	return len(m.few)
}

// Get returns the value of k, and whether m holds k.
func (m *Map[K, V]) Get(k K) (V, bool) {
	if m.many != nil {
		v, ok := m.many[k]
		return v, ok
	}
	for _, e := range m.few {
		if e.k == k {
			return e.v, true
		}
	}
	var zero V
	return zero, false
}

// Set sets the value of k.
func (m *Map[K, V]) Set(k K, v V) {
	if m.many != nil {
		m.many[k] = v
		return
	}
	for i := range m.few {
		if m.few[i].k == k {
			m.few[i].v = v
			return
		}
	}
	if len(m.few) < Few {
		m.few = append(m.few, entry[K, V]{k, v})
		return
	}
	m.many = make(map[K]V, len(m.few)+1)
	for _, e := range m.few {
		m.many[e.k] = e.v
	}
	m.many[k] = v
	m.few = nil
}

// Delete removes k, and returns its value and whether m held it.
func (m *Map[K, V]) Delete(k K) (V, bool) {
	if m.many != nil {
		v, ok := m.many[k]
		delete(m.many, k)
		return v, ok
	}
	for i, e := range m.few {
		if e.k == k {
			last := len(m.few) - 1
			m.few[i] = m.few[last]
			m.few[last] = entry[K, V]{}
			m.few = m.few[:last]
			if last == 0 {
				m.few = nil
			}
			return e.v, true
		}
	}
	var zero V
	return zero, false
}

// All yields the entries of m, in no order. m must not change meanwhile.
func (m *Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		if m.many != nil {
			for k, v := range m.many {
				if !yield(k, v) {
					return
				}
			}
			return
		}
		for _, e := range m.few {
			if !yield(e.k, e.v) {
				return
			}
		}
	}
}

// Clear removes all entries, and the memory that held them.
func (m *Map[K, V]) Clear() { *m = Map[K, V]{} }
