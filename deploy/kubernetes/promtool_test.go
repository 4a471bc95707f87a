package kubernetes

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/causet/projection-worker/internal/testtool"
)

// promtool runs promtool with args in dir and fails t with its output when
// it exits non-zero.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(testtool.Require(t, "promtool"), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// unitTests is the part of a promtool unit-test file this test reads.
type unitTests struct {
	Tests []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRulesPromtool: the PrometheusRule's groups pass `promtool check
// rules` and the unit tests of prometheus/alerts_test.yaml (`promtool test
// rules`), which test every alert both firing, with its labels and rendered
// annotations, and quiet. Each alert has a severity and says what to do
// (summary, description, runbook).
func TestAlertRulesPromtool(t *testing.T) {
	rule := build(t, "base").PrometheusRules[0]
	rules, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := os.WriteFile(filepath.Join(tmp, "alerts.rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(dir(t), "prometheus", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(promtool(t, tmp, "check", "rules", "alerts.rules.yaml"))
	t.Log(promtool(t, tmp, "test", "rules", "alerts_test.yaml"))

	var ut unitTests
	if err := yaml.Unmarshal(tests, &ut); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range ut.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: want a unit test where it fires and one where it does not (fires %t, quiet %t)", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			if r.Labels["severity"] == "" {
				t.Errorf("alert %s has no severity label", r.Alert)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
		}
	}
	if n != 6 {
		t.Errorf("%d alerts, want the issue's 6: dead letters rising, partition stuck, partitions paused, lag high and growing, DLQ retention, worker not ready", n)
	}
}
