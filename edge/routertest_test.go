package edge_test

import (
	"testing"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/routertest"
)

// TestMemoryRouterContract checks MemoryRouter against the contract of
// edge.Router.
func TestMemoryRouterContract(t *testing.T) {
	routertest.Run(t, func(t *testing.T) edge.Router { return new(edge.MemoryRouter) })
}
