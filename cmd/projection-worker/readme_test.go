package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReadmeFlagTableIsTheRunFlags: the README's flag table of
// projection-worker lists every flag of run with its environment variable,
// and nothing run does not take.
func TestReadmeFlagTableIsTheRunFlags(t *testing.T) {
	table := readmeAfter(t, "\n| flag | env | default | |\n")
	documented := map[string]string{} // flag -> env
	for _, row := range strings.Split(table, "\n") {
		if !strings.HasPrefix(row, "|") {
			break
		}
		cells := strings.Split(row, "|")
		if len(cells) < 4 || strings.HasPrefix(cells[1], "---") {
			continue
		}
		var flags, envs []string
		for _, m := range backquoted.FindAllStringSubmatch(cells[1], -1) {
			flags = append(flags, strings.TrimPrefix(m[1], "--"))
		}
		for _, m := range backquoted.FindAllStringSubmatch(cells[2], -1) {
			envs = append(envs, m[1])
		}
		if len(flags) != len(envs) {
			t.Errorf("README row %q: %d flags, %d variables", row, len(flags), len(envs))
			continue
		}
		for i, f := range flags {
			documented[f] = envs[i]
		}
	}
	if len(documented) < 10 {
		t.Fatalf("README flag table: %d flags read, the table was not parsed", len(documented))
	}
	var s settings
	fs := runFlags(&s, io.Discard)
	env := fs.Env()
	served := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { served[f.Name] = env[f.Name] })
	if diff := cmp.Diff(served, documented); diff != "" {
		t.Errorf("run's flags and variables (-) against the README's table (+):\n%s", diff)
	}
}

// readmeAfter returns the README's text after marker, failing t when the
// README lacks it.
func readmeAfter(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("README.md has no %q", strings.TrimSpace(marker))
	}
	return rest
}
