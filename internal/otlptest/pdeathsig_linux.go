package otlptest

import (
	"os/exec"
	"syscall"
)

// setPdeathsig has the kernel kill the collector when the test process dies
// without stopping it (a panic, go test's -timeout).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
