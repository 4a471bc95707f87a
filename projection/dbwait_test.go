package projection

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeNamesTheDatabaseWaitLines: every line a partition waiting for
// the database writes, and Ready's cause, are in the README's Operations
// section as the worker writes them, for an outage and for a transaction
// conflict.
func TestReadmeNamesTheDatabaseWaitLines(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	for _, w := range []dbWaitWords{unavailableWords, conflictWords} {
		for _, s := range []string{"paused: " + w.cause + ": ", "`" + w.waiting + "`", "`" + w.paused + "`", "`" + w.resumed + "`"} {
			if !strings.Contains(readme, s) {
				t.Errorf("README.md does not say %s", s)
			}
		}
	}
}
