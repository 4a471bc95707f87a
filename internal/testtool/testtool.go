// Package testtool finds the command-line tools tests run (kcat, jq,
// promtool, buildah, make), and serves test connections (Serve).
package testtool

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Require returns the path of the tool name. It skips t when the tool is
// missing, or fails it when the environment variable CI is true
// (scripts/install-deps.sh installs the tools there).
func Require(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("%s is required when CI is set (scripts/install-deps.sh installs it): %v", name, err)
	}
	t.Skipf("%s not on PATH (sudo bash scripts/install-deps.sh installs it; with CI=true this fails): %v", name, err)
	return ""
}

// Serve accepts the connections of ln until it is closed, each handed to
// handle on a goroutine of its own and closed when handle returns; ln is
// closed when t ends.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
