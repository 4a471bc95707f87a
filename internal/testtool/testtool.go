// Package testtool finds the command-line tools tests run (kcat, jq,
// promtool, buildah, make).
package testtool

import (
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
