package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/causet/projection-worker/internal/pgtest"
)

// procStat returns the fields of /proc/<pid>/stat from field 3 (state) on,
// so that field n of proc(5) is f[n-3]; nil when unreadable.
func procStat(pid int) []string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	_, rest, ok := strings.Cut(string(data), ") ") // the command name may hold spaces
	if !ok {
		return nil
	}
	return strings.Fields(rest)
}

// ticks returns the sum of the clock ticks (1/100 s) in fields ns of f.
func ticks(f []string, ns ...int) time.Duration {
	var sum int64
	for _, n := range ns {
		if n-3 < len(f) {
			v, _ := strconv.ParseInt(f[n-3], 10, 64)
			sum += v
		}
	}
	return time.Duration(sum) * 10 * time.Millisecond
}

// postgresCPU measures the CPU time of the local PostgreSQL cluster the
// benchmark writes to: its postmaster's own and reaped children's (fields
// 14–17 of /proc/<pid>/stat) plus every live child's (backends,
// checkpointer, WAL writer, autovacuum: fields 14 and 15). The zero value
// (PostgreSQL not on this host, or not readable) measures nothing.
type postgresCPU struct{ postmaster int }

// newPostgresCPU finds the postmaster of pool's server: the parent of one
// of its backends.
func newPostgresCPU(ctx context.Context, pool *pgxpool.Pool) postgresCPU {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return postgresCPU{}
	}
	f := procStat(backend)
	if len(f) < 2 {
		return postgresCPU{} // another host, or a container of its own
	}
	pm, _ := strconv.Atoi(f[1]) // field 4, ppid
	return postgresCPU{postmaster: pm}
}

// used returns the cluster's CPU time so far; 0 when it cannot be read.
func (p postgresCPU) used() time.Duration {
	if p.postmaster == 0 {
		return 0
	}
	total := ticks(procStat(p.postmaster), 14, 15, 16, 17)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	parent := strconv.Itoa(p.postmaster)
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 12 && f[1] == parent {
			total += ticks(f, 14, 15)
		}
	}
	return total
}

// TestPostgresCPU checks that the benchmark's PostgreSQL CPU figure counts
// a backend's work: a query that keeps a backend busy for some 100 ms
// raises it by at least half of that. It skips when PostgreSQL runs
// elsewhere (the figure is then left out of the table).
func TestPostgresCPU(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	pg := newPostgresCPU(ctx, pool)
	if pg.postmaster == 0 {
		t.Skip("PostgreSQL does not run on this host: its CPU is not measured")
	}
	before := pg.used()
	start := time.Now()
	var sum int64
	if err := pool.QueryRow(ctx, "SELECT sum(i) FROM generate_series(1, 3000000) i").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if got := pg.used() - before; got < took/2 {
		t.Fatalf("PostgreSQL's CPU grew by %s over a query of %s, want at least half of it", got, took)
	}
}
