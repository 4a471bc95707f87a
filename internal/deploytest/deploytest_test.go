package deploytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDecodeFileIsStrict: a misspelt or misplaced field, a duplicate field
// or an unknown kind fails the decode, for built-in, KEDA and Prometheus
// Operator kinds alike; the right spelling passes.
func TestDecodeFileIsStrict(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr string // "" for success
	}{
		{"deployment", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\nspec:\n  replicas: 2\n", ""},
		{"deployment misspelt field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\nspec:\n  replica: 2\n", `unknown field "replica"`},
		{"duplicate field", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {A: x}\ndata: {B: y}\n", "duplicate"},
		{"scaledobject", "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: s}\nspec:\n  scaleTargetRef: {name: w}\n  maxReplicaCount: 3\n  triggers: [{type: kafka, metadata: {topic: t}}]\n", ""},
		{"scaledobject hpa field", "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: s}\nspec:\n  scaleTargetRef: {name: w}\n  maxReplicas: 3\n  triggers: []\n", `unknown field "maxReplicas"`},
		{"podmonitor servicemonitor field", "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: p}\nspec:\n  selector: {}\n  endpoints: [{port: http}]\n", `unknown field "endpoints"`},
		{"prometheusrule", "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: r}\nspec:\n  groups: [{name: g, rules: [{alert: A, expr: up == 0, for: 5m}]}]\n", ""},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", `kind "Pod": no Go type`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.yaml")
			if err := os.WriteFile(path, []byte("# comment\n---\n"+tt.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			objs, err := DecodeFile(path)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("DecodeFile: %v", err)
			case tt.wantErr == "" && objs.Count != 1:
				t.Fatalf("decoded %d objects, want 1", objs.Count)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("DecodeFile error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
