//go:build !linux

package examples_test

import (
	"errors"
	"os/exec"
)

// isolatedCommand needs Linux's network and PID namespaces.
func isolatedCommand(string, ...string) (*exec.Cmd, error) {
	return nil, errors.New("network namespaces need Linux")
}

func isolatedChild() {}
