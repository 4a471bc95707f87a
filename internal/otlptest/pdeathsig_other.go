//go:build !linux

package otlptest

import "os/exec"

// setPdeathsig does nothing where the kernel has no parent-death signal: a
// collector outlives a test process that dies without stopping it.
func setPdeathsig(*exec.Cmd) {}
