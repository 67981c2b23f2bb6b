package agentcmd

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/tunnelkit/tunnelkit/agent"
)

// hintAfter is how many attempts in a row to reach the edge fail before
// the agent says, once, what to check.
const hintAfter = 3

// reachHint watches the client's events: when hintAfter attempts in a
// row to reach the edge failed, it logs one line saying what to check,
// for the way they failed; a session up starts the count anew.
type reachHint struct {
	log *slog.Logger

	mu     sync.Mutex
	failed int
}

// see counts e.
func (h *reachHint) see(e agent.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch e.Kind {
	case agent.Connected:
		h.failed = 0
	case agent.Reconnecting:
		if e.Err == nil || errors.Is(e.Err, agent.ErrUnavailable) {
			return // the edge answered: it is there
		}
		if h.failed++; h.failed == hintAfter {
			h.log.Warn("the edge cannot be reached: "+reachAdvice(e.Err)+"; the agent keeps trying (-wait bounds how long)", "edge", e.Addr, "attempts", h.failed, "err", e.Err)
		}
	}
}

// reachAdvice says what to check when reaching the edge failed with err.
func reachAdvice(err error) string {
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns):
		return "its name does not resolve: check -edge"
	case errors.Is(err, agent.ErrProxy):
		return "the proxy on the way cannot reach it: check -proxy (or HTTPS_PROXY) and that the proxy lets out the edge's port"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens there: check that the edge runs ('tunnelkit edge') and that -edge names its -agents address (127.0.0.1:7000 by default)"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "it does not answer: check the address, the network, and any firewall on the way to the edge's -agents port"
	}
	return "check that the edge runs, that -edge names its -agents address, and the network on the way"
}
