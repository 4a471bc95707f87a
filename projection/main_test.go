package projection

import (
	"os"
	"testing"

	"github.com/causet/projection-worker/internal/pgtest"
)

// TestMain closes the PostgreSQL server shared by the package's tests
// (pgtest.URL, pgtest.Pool) when they end.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
