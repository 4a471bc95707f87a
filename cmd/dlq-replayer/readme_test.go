package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/testtool"
)

// readmeSession returns the commands and outputs of the first console
// block ("$ " lines, then what each prints) of README.md's dlq-replayer
// section.
func readmeSession(t *testing.T) (cmds []string, outs [][]string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### dlq-replayer\n")
	if !ok {
		t.Fatal("README.md has no ### dlq-replayer section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "\n```console\n")
	if !ok {
		t.Fatal("README.md's dlq-replayer section has no ```console block")
	}
	block, _, _ = strings.Cut(block, "\n```\n")
	for _, l := range strings.Split(block, "\n") {
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			cmds = append(cmds, c)
			outs = append(outs, nil)
			continue
		}
		if len(cmds) == 0 {
			t.Fatalf("README.md's dlq-replayer console block starts with %q, want a \"$ \" command", l)
		}
		outs[len(outs)-1] = append(outs[len(outs)-1], l)
	}
	return cmds, outs
}

// TestREADMEReplayerSession runs the README's dlq-replayer session (summary
// to find a fingerprint, skip and retry by fingerprint, a dry run first)
// with the built command in a shell, on the dead letters of the seed, and
// checks that each command prints what the README shows, byte for byte
// (the events topic written as its default): the fingerprints there are
// real ones (issue 12).
func TestREADMEReplayerSession(t *testing.T) {
	cmds, outs := readmeSession(t)
	if len(cmds) < 3 {
		t.Fatalf("README.md's dlq-replayer session has %d commands, want summary, then skip or retry by fingerprint", len(cmds))
	}
	bash := testtool.Require(t, "bash")
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f := newFixture(t, kafkatest.New(t))
	f.seed(t)
	env := append(os.Environ(), "PATH="+bin+string(filepath.ListSeparator)+os.Getenv("PATH"))
	for k, v := range f.env {
		env = append(env, k+"="+v)
	}
	for i, c := range cmds {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sh := exec.CommandContext(ctx, bash, "-c", c)
		sh.Env = env
		var stdout, stderr bytes.Buffer
		sh.Stdout, sh.Stderr = &stdout, &stderr
		err := sh.Run()
		cancel()
		if err != nil {
			t.Fatalf("$ %s: %v\nstderr:\n%s", c, err, stderr.String())
		}
		got := strings.Split(strings.TrimSuffix(strings.ReplaceAll(stdout.String(), f.events, defaultEventsTopic), "\n"), "\n")
		if diff := cmp.Diff(outs[i], got); diff != "" {
			t.Errorf("$ %s\nprints other lines than README.md shows (-README +got):\n%s\nput this in README.md:\n$ %s\n%s",
				c, diff, c, strings.Join(got, "\n"))
		}
	}
}

// TestReadmeNamesTheFlagAliases: every alias the replayer takes (--tls
// for --kafka-tls, ...) is named in README.md's dlq-replayer section
// (new-user trial: they were in -h only).
func TestReadmeNamesTheFlagAliases(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n### dlq-replayer\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var s settings
	fs := flagenv.New("dlq-replayer list", io.Discard)
	aliases := s.register(fs, "list", func(string) (string, bool) { return "", false })
	if len(aliases.list) == 0 {
		t.Fatal("no aliases registered: the test checks nothing")
	}
	fs.VisitAll(func(f *flag.Flag) {
		if target, ok := strings.CutPrefix(f.Usage, "same as --"); ok && !strings.Contains(section, "`--"+f.Name+"`") {
			t.Errorf("README's dlq-replayer section does not name --%s (same as --%s)", f.Name, target)
		}
	})
}

// TestReadmeVariableRuleHolds: the README's rule for the replayer's
// variables, DLQ_ and the flag's name in capitals, holds for every flag
// of every command but the topics', logging and Kafka settings, which are
// the worker's variables (docs trial: DLQ_DRY_RUN, DLQ_RATE and others
// were in -h only).
func TestReadmeVariableRuleHolds(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(b)), " "), "`DLQ_` and the flag's name in capitals (`--dry-run` is `DLQ_DRY_RUN`") {
		t.Fatal("README does not state the rule this test checks")
	}
	workers := map[string]bool{"DLQ_TOPIC": true, "EVENTS_TOPIC": true, "LEDGER_TOPIC": true, "LOG_LEVEL": true, "LOG_FORMAT": true}
	checked := 0
	for _, c := range commands {
		var s settings
		fs := flagenv.New("dlq-replayer "+c, io.Discard)
		s.register(fs, c, func(string) (string, bool) { return "", false })
		for name, env := range fs.Env() {
			if workers[env] || strings.HasPrefix(env, "KAFKA_") {
				continue
			}
			checked++
			if want := "DLQ_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")); env != want {
				t.Errorf("%s --%s: variable %s, the README's rule says %s", c, name, env, want)
			}
		}
	}
	if checked < 20 {
		t.Errorf("%d flags checked, want the filters and the commands' own (20 or more)", checked)
	}
}
