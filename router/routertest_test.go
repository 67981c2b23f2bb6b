package router_test

import (
	"testing"

	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/router/routertest"
)

// TestMemoryRouterContract checks MemoryRouter against the contract of
// router.Router.
func TestMemoryRouterContract(t *testing.T) {
	routertest.Run(t, func(t *testing.T) router.Router { return new(router.MemoryRouter) })
}
