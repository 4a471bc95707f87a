// Package jqcheck checks, in tests, that a document is read by strict
// JSON parsers and not only by encoding/json, which is lenient: it accepts
// unpaired UTF-16 surrogate escapes (replacing them with U+FFFD) and 10000
// levels of nesting. jq 1.6 refuses both an unpaired high surrogate escape
// and nesting deeper than 256 levels, so a dead letter it cannot read
// empties a whole `kcat ... | jq` pipeline.
package jqcheck

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Check fails t unless doc is one JSON value that encoding/json reads (valid,
// and decoded with UseNumber, so that numbers beyond float64 are kept as
// text) and that jq reads too (`jq -e type`, the jq on PATH). Without jq on
// PATH it logs that the jq check was left out, or fails t when the
// environment variable CI is true (scripts/install-deps.sh installs jq), so
// that callers such as whole worker scenarios need not skip.
func Check(t testing.TB, doc []byte) {
	t.Helper()
	if !json.Valid(doc) {
		t.Errorf("encoding/json: not valid JSON: %.300q", doc)
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Errorf("encoding/json: %v: %.300q", err, doc)
	}
	jq, err := exec.LookPath("jq")
	if err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("jq is required when CI is set (scripts/install-deps.sh installs it): %v", err)
		}
		t.Logf("jq not on PATH, its check left out (apt-get install jq; with CI=true this fails): %v", err)
		return
	}
	cmd := exec.Command(jq, "-e", "type")
	cmd.Stdin = bytes.NewReader(doc)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("jq cannot read the document: %v: %s\n%.300q", err, bytes.TrimSpace(out), doc)
	}
}
