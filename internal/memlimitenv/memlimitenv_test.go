package memlimitenv

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/causet/projection-worker/internal/flagenv"
)

// TestSetMemoryLimitLeavesAnExplicitSetting: with GOMEMLIMIT or
// AUTOMEMLIMIT=off in the environment, run's memory limit is Go's own
// (the one GOMEMLIMIT gave at start), not 90 % of the container's, and
// nothing is logged at INFO.
func TestSetMemoryLimitLeavesAnExplicitSetting(t *testing.T) {
	for _, env := range [][2]string{{"GOMEMLIMIT", "123MiB"}, {"AUTOMEMLIMIT", "off"}} {
		t.Run(env[0], func(t *testing.T) {
			t.Setenv(env[0], env[1])
			before := debug.SetMemoryLimit(-1)
			defer debug.SetMemoryLimit(before)
			var buf bytes.Buffer
			if err := Set(slog.New(slog.NewTextHandler(&buf, nil)), memlimit.Limit(1<<30)); err != nil {
				t.Fatal(err)
			}
			if after := debug.SetMemoryLimit(-1); after != before {
				t.Errorf("%s=%s: memory limit %d, want it left at %d", env[0], env[1], after, before)
			}
			if strings.Contains(buf.String(), "memory limit set") {
				t.Errorf("%s=%s: logged %q", env[0], env[1], buf.String())
			}
		})
	}
}

// TestSetMemoryLimitTakesNinetyPercentOfTheContainers: a container limit
// of 1 GiB gives Go a soft limit of 90 % of it, logged at INFO; and
// AUTOMEMLIMIT changes the ratio.
func TestSetMemoryLimitTakesNinetyPercentOfTheContainers(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOMEMLIMIT")
	for _, tt := range []struct {
		ratio string
		want  int64
	}{{"unset", 1 << 30 * 9 / 10}, {"", 1 << 30 * 9 / 10}, {"0.5", 1 << 29}} {
		// Empty counts as unset (second new-user trial: it stopped run).
		t.Run("AUTOMEMLIMIT="+tt.ratio, func(t *testing.T) {
			t.Setenv("AUTOMEMLIMIT", tt.ratio) // restored after the test
			if tt.ratio == "unset" {
				os.Unsetenv("AUTOMEMLIMIT")
			}
			before := debug.SetMemoryLimit(-1)
			defer debug.SetMemoryLimit(before)
			var buf bytes.Buffer
			if err := Set(slog.New(slog.NewTextHandler(&buf, nil)), memlimit.Limit(1<<30)); err != nil {
				t.Fatal(err)
			}
			if got := debug.SetMemoryLimit(-1); got != tt.want {
				t.Errorf("memory limit %d, want %d", got, tt.want)
			}
			if !strings.Contains(buf.String(), "Go memory limit set from the container's") {
				t.Errorf("logged %q, want the limit at INFO", buf.String())
			}
		})
	}
}

// TestSetMemoryLimitRefusesAnUnreadableAutomemlimit: an AUTOMEMLIMIT that
// is neither off nor a ratio in (0, 1] stops the command with a usage error naming
// it, the limit untouched (new-user trial: 2, -1 and abc were logged at
// DEBUG and the container's limit silently not applied).
func TestSetMemoryLimitRefusesAnUnreadableAutomemlimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOMEMLIMIT")
	for _, v := range []string{"2", "-1", "0", "abc", "NaN", "OFF"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("AUTOMEMLIMIT", v)
			before := debug.SetMemoryLimit(-1)
			defer debug.SetMemoryLimit(before)
			err := Set(slog.New(slog.DiscardHandler), memlimit.Limit(1<<30))
			var ue *flagenv.UsageError
			if err == nil || !strings.Contains(err.Error(), "AUTOMEMLIMIT=") || !errors.As(err, &ue) {
				t.Errorf("AUTOMEMLIMIT=%q: %v, want a usage error naming it (exit 2)", v, err)
			}
			if got := debug.SetMemoryLimit(-1); got != before {
				t.Errorf("AUTOMEMLIMIT=%q: memory limit %d, want it left at %d", v, got, before)
			}
		})
	}
}
