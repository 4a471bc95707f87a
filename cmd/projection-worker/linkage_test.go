package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBinariesLinkNoTestCode checks that the production commands link no
// test code (issue 9): neither package testing, nor the in-process broker
// kfake, nor the test harnesses. The dev command, which needs kfake and a
// throwaway PostgreSQL, is built only with -tags dev (make run).
func TestBinariesLinkNoTestCode(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go command: %v", err)
		}
		t.Skipf("no go command on the PATH: %v", err)
	}
	forbidden := map[string]string{
		"testing":                            "package testing",
		"github.com/twmb/franz-go/pkg/kfake": "the in-process broker kfake",
		"github.com/causet/projection-worker/internal/pgtest":    "the PostgreSQL test harness",
		"github.com/causet/projection-worker/internal/kafkatest": "the Kafka test harness",
		"github.com/causet/projection-worker/internal/devstack":  "the dev stack",
	}
	for _, cmd := range []string{"github.com/causet/projection-worker/cmd/projection-worker", "github.com/causet/projection-worker/cmd/dlq-replayer"} {
		t.Run(cmd[strings.LastIndex(cmd, "/")+1:], func(t *testing.T) {
			// GOFLAGS cleared: a -tags dev in the environment would list
			// the dev build instead of the production one.
			c := exec.Command(goBin, "list", "-deps", cmd)
			c.Env = append(os.Environ(), "GOFLAGS=")
			out, err := c.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("go list -deps %s: %v\n%s", cmd, err, stderr)
			}
			deps := strings.Fields(string(out))
			if len(deps) == 0 {
				t.Fatalf("go list -deps %s listed nothing", cmd)
			}
			for _, dep := range deps {
				if what, ok := forbidden[dep]; ok || strings.HasPrefix(dep, "testing/") {
					if !ok {
						what = "package " + dep
					}
					t.Errorf("%s links %s (%s)", cmd, what, dep)
				}
			}
		})
	}
}
