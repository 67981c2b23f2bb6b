package edge

import "context"

// SetTestHookLookup makes hook run with the context of each lookup s makes
// of its Router, before the Router is asked, for the tests of package
// edge_test. Call it before s runs.
func SetTestHookLookup(s *Server, hook func(context.Context)) { s.testHookLookup = hook }

// BindGuardOwners returns how many owners s keeps a budget of refused
// binds for.
func BindGuardOwners(s *Server) int { return s.binds.Owners() }

// ReasonStatus returns the HTTP status the edge answers a request with for
// r; 0 for a Reason that answers no HTTP request.
func ReasonStatus(r Reason) int { return r.status() }

// SetMovesInFlight sets how many agents s's Drain has moving at once.
func SetMovesInFlight(s *Server, n int) { s.movesInFlight = n }
