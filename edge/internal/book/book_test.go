package book

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/router"
)

// sortLarge orders as slices.SortFunc does, for every length and order.
func TestSortLarge(t *testing.T) {
	for n := range 200 {
		s := make([]view.Endpoint, n)
		for i := range s {
			s[i] = view.Endpoint{URL: fmt.Sprint(rand.IntN(n + 1)), Session: fmt.Sprint(i)}
		}
		by := func(a, b *view.Endpoint) int {
			return cmp.Or(cmp.Compare(a.URL, b.URL), cmp.Compare(a.Session, b.Session))
		}
		want := slices.Clone(s)
		slices.SortFunc(want, func(a, b view.Endpoint) int { return by(&a, &b) })
		sortLarge(s, by)
		if !slices.EqualFunc(s, want, func(a, b view.Endpoint) bool { return a.URL == b.URL && a.Session == b.Session }) {
			t.Fatalf("n=%d: %v, want %v", n, s, want)
		}
	}
}

// Finish counts the pools among all the sessions, and only the endpoints
// that asked for one; Endpoints orders them all by URL, then session.
func TestFinishAndEndpoints(t *testing.T) {
	ep := func(session, name string, pool bool) view.Endpoint {
		e := &Endpoint{Route: router.Route{Proto: "http", Name: name, SessionID: session, Pool: pool}, URL: "http://" + name}
		return e.View()
	}
	sessions := []view.Session{
		{ID: "s1", Endpoints: []view.Endpoint{ep("s1", "p.example.test", true), ep("s1", "a.example.test", false)}},
		{ID: "s2", Endpoints: []view.Endpoint{ep("s2", "p.example.test", true)}},
		{ID: "s3", Endpoints: []view.Endpoint{ep("s3", "p.example.test", true), ep("s3", "b.example.test", true)}},
	}
	Finish(sessions)
	if got := sessions[0].Endpoints; got[0].Name != "a.example.test" || got[0].Pool != 1 || got[1].Pool != 3 {
		t.Fatalf("session s1 after Finish: %+v", got)
	}
	var got []string
	for _, e := range Endpoints(sessions) {
		got = append(got, fmt.Sprintf("%s %s %d", e.Name, e.Session, e.Pool))
	}
	want := []string{"a.example.test s1 1", "b.example.test s3 1", "p.example.test s1 3", "p.example.test s2 3", "p.example.test s3 3"}
	if !slices.Equal(got, want) {
		t.Fatalf("Endpoints: %v, want %v", got, want)
	}
}
