package edge

import "context"

// SetTestHookLookup makes hook run with the context of each lookup s makes
// of its Router, before the Router is asked, for the tests of package
// edge_test. Call it before s runs.
func SetTestHookLookup(s *Server, hook func(context.Context)) { s.testHookLookup = hook }
