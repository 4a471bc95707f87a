// Package memlimitenv sets Go's soft memory limit from the container's, as
// both commands do at start (projection-worker run, dlq-replayer).
package memlimitenv

import (
	"log/slog"
	"math"
	"os"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/causet/projection-worker/internal/flagenv"
)

// Set sets Go's soft memory limit to 90 % of the container's
// (the cgroup's memory limit, read by github.com/KimMachineGun/automemlimit),
// so that the GC works harder as the heap nears it, with room left for
// what is not heap, before the container is OOM-killed. GOMEMLIMIT set, or
// AUTOMEMLIMIT=off, leaves Go's limit alone; AUTOMEMLIMIT=<ratio in (0,1]>
// changes the 90 %. Without a limit (no cgroup, or none set) nothing
// changes. It logs the limit it set at INFO, a failure to read it at DEBUG.
// provider gives the container's limit (memlimit.FromCgroup). An
// AUTOMEMLIMIT that is neither off nor a ratio in (0, 1] is a usage error
// naming it (the library would only log it, at DEBUG, and set nothing).
func Set(log *slog.Logger, provider memlimit.Provider) error {
	if v, ok := os.LookupEnv("AUTOMEMLIMIT"); ok && v == "" {
		// Empty counts as unset, as for every setting (the library would
		// refuse it and set nothing).
		os.Unsetenv("AUTOMEMLIMIT")
	} else if ok && v != "off" {
		if r, err := strconv.ParseFloat(v, 64); err != nil || !(r > 0 && r <= 1) {
			return flagenv.Usagef("AUTOMEMLIMIT=%q: want a ratio in (0, 1] of the container's memory limit (unset: 0.9), or off", v)
		}
	}
	limit, err := memlimit.Set(memlimit.WithProvider(provider))
	switch {
	case err != nil:
		log.Debug("Go memory limit not set from the container's", "error", err)
	case os.Getenv("GOMEMLIMIT") == "" && os.Getenv("AUTOMEMLIMIT") != "off" && limit < math.MaxInt64:
		log.Info("Go memory limit set from the container's", "bytes", limit)
	}
	return nil
}
