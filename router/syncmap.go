package router

import (
	"iter"
	"sync"
)

// syncMap is a sync.Map with typed keys and values.
type syncMap[K comparable, V any] struct{ m sync.Map }

func (m *syncMap[K, V]) load(k K) (v V, ok bool) {
	x, ok := m.m.Load(k)
	if !ok {
		return v, false
	}
	return x.(V), true
}

func (m *syncMap[K, V]) store(k K, v V) { m.m.Store(k, v) }

func (m *syncMap[K, V]) delete(k K) { m.m.Delete(k) }

// all yields the entries of m; see sync.Map.Range.
func (m *syncMap[K, V]) all() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		m.m.Range(func(k, v any) bool { return yield(k.(K), v.(V)) })
	}
}
