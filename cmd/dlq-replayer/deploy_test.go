package main

import (
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/internal/deploytest"
	"github.com/causet/projection-worker/internal/flagenv"
)

// TestDeployReplayJobs: the replay Jobs of deploy/kubernetes (in the example
// overlay) run dlq-replayer retry with arguments and an environment that
// parse with the replayer's own flag set and pass its checks; they select a
// filtered set (not --all), the dry run the very same set as the retry,
// with --dry-run only there; they read the worker's brokers and topics; an
// actor is named (a Job has no $USER); and each variable a Job sets itself
// is one the replayer reads.
func TestDeployReplayJobs(t *testing.T) {
	dir, err := deploytest.Dir()
	if err != nil {
		t.Fatal(err)
	}
	worker, err := deploytest.Build(filepath.Join(dir, "overlays", "example"))
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := deploytest.ExampleSecrets()
	if err != nil {
		t.Fatal(err)
	}
	cm := worker.ConfigMap("projection-worker-settings")
	now := time.Now()
	parsed := map[string]*settings{}
	filters := map[string]dlq.Filters{}
	for _, name := range []string{"replay-dry-run", "replay-retry"} {
		t.Run(name, func(t *testing.T) {
			objs, err := deploytest.Build(filepath.Join(dir, "overlays", "example", "jobs", name))
			if err != nil {
				t.Fatal(err)
			}
			if len(objs.Jobs) != 1 || len(objs.Jobs[0].Spec.Template.Spec.Containers) != 1 {
				t.Fatal("want one Job with one container")
			}
			c := objs.Jobs[0].Spec.Template.Spec.Containers[0]
			if !slices.Equal(c.Command, []string{"/usr/local/bin/dlq-replayer"}) || len(c.Args) == 0 || c.Args[0] != "retry" {
				t.Fatalf("Job runs %q %q, want /usr/local/bin/dlq-replayer retry ...", c.Command, c.Args)
			}
			env, err := deploytest.ResolveEnv(worker, secrets, c)
			if err != nil {
				t.Fatal(err)
			}
			s := &settings{}
			fs := flagenv.New("dlq-replayer retry", io.Discard).WithLookup(env.Lookup)
			aliases := s.register(fs, "retry", env.Lookup)
			if err := fs.Parse(c.Args[1:]); err != nil {
				t.Fatalf("args %q: %v", c.Args, err)
			}
			if err := aliases.apply(); err != nil {
				t.Fatal(err)
			}
			if fs.NArg() > 0 {
				t.Fatalf("args %q: unexpected argument %q", c.Args, fs.Arg(0))
			}
			for _, n := range deploytest.Unread(fs, env.Explicit) {
				t.Errorf("the Job sets %s, which dlq-replayer does not read", n)
			}
			f, err := s.filters(now)
			if err != nil {
				t.Fatalf("filters: %v", err)
			}
			if s.all || f.IsZero() {
				t.Error("the Job replays every dead letter: give it filters instead of --all")
			}
			if _, err := s.kafka.Opts(); err != nil {
				t.Error(err)
			}
			if _, _, err := s.logger(io.Discard, false); err != nil {
				t.Error(err)
			}
			if s.kafka.Brokers != cm.Data["KAFKA_BROKERS"] || s.topic != cm.Data["EVENTS_TOPIC"] ||
				s.dlqTopic != cm.Data["DLQ_TOPIC"] || s.ledgerTopic != cm.Data["LEDGER_TOPIC"] {
				t.Errorf("the Job reads %s, topics %s %s %s; the worker's settings differ: %v", s.kafka.Brokers, s.topic, s.dlqTopic, s.ledgerTopic, cm.Data)
			}
			if s.actor == "" || s.actor == defaultActor(func(string) (string, bool) { return "", false }) {
				t.Errorf("actor %q: name who runs the replay with --actor", s.actor)
			}
			if s.dryRun != (name == "replay-dry-run") {
				t.Errorf("--dry-run is %t in %s", s.dryRun, name)
			}
			parsed[name], filters[name] = s, f
		})
	}
	if dry, retry := parsed["replay-dry-run"], parsed["replay-retry"]; dry != nil && retry != nil {
		if diff := cmp.Diff(filters["replay-retry"], filters["replay-dry-run"]); diff != "" {
			t.Errorf("the dry run selects other dead letters than the retry (-retry +dry-run):\n%s", diff)
		}
	}
}
