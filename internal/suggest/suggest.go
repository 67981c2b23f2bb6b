// Package suggest finds, among the names a program knows, the one a
// mistyped name was meant to be: for "did you mean" in its errors.
package suggest

import "sort"

// Closest returns the name among names nearest to s, when one is near
// enough to be what was meant (a typo, a missing or doubled letter, a
// prefix); "" otherwise. Names are compared as they are.
func Closest(s string, names []string) string {
	names = append([]string(nil), names...)
	sort.Strings(names)
	best, bestD := "", 1<<30
	for _, n := range names {
		d := distance(s, n)
		if len(s) >= 3 && len(n) > len(s) && n[:len(s)] == s {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = n, d
		}
	}
	allowed := max(1, len(s)/3) // "x" is no typo of "to"
	if len(s) >= 4 {
		allowed = max(2, allowed)
	}
	if bestD <= allowed {
		return best
	}
	return ""
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
