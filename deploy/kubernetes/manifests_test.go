// Package kubernetes holds only tests: of the manifests in this directory
// (strict decoding, kustomize builds, the hardening the issue asks for), of
// the alerts (promtool) and of the container image (buildah). The checks
// against the commands' own flags and a running worker are in
// cmd/projection-worker and cmd/dlq-replayer (deploy_test.go).
package kubernetes

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/causet/projection-worker/internal/deploytest"
)

// dir returns deploy/kubernetes (this package's directory, where go test
// runs).
func dir(t *testing.T) string {
	t.Helper()
	d, err := deploytest.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// build runs kustomize build on deploy/kubernetes/rel.
func build(t *testing.T, rel string) *deploytest.Objects {
	t.Helper()
	objs, err := deploytest.Build(filepath.Join(dir(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestManifestsDecodeStrictly: every kustomization.yaml decodes strictly
// into kustomize's Kustomization, and every other YAML file here (objects,
// patches, the Secret example) into the Go type of its kind: k8s.io/api's,
// the Prometheus Operator's, or deploytest's KEDA types. An unknown or
// misplaced field fails.
func TestManifestsDecodeStrictly(t *testing.T) {
	ks, err := deploytest.Kustomizations(dir(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) < 2 {
		t.Fatalf("found %d kustomizations, want the base and an overlay at least", len(ks))
	}
	files, err := deploytest.ManifestFiles(dir(t), ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(dir(t), f)
		t.Run(rel, func(t *testing.T) {
			objs, err := deploytest.DecodeFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if objs.Count == 0 {
				t.Errorf("%s holds no object", rel)
			}
		})
	}
}

// TestKustomizationsBuild: every kustomization builds with the kustomize Go
// API and its output decodes strictly; the base and the example overlay
// hold the worker's objects and no Secret (kubectl apply -k must never
// overwrite the real one).
func TestKustomizationsBuild(t *testing.T) {
	ks, err := deploytest.Kustomizations(dir(t))
	if err != nil {
		t.Fatal(err)
	}
	for kdir, k := range ks {
		rel, _ := filepath.Rel(dir(t), kdir)
		if k.Kind == "Component" {
			continue // built into an overlay by TestCPUAutoscalerComponent
		}
		t.Run(rel, func(t *testing.T) {
			objs := build(t, rel)
			if objs.Count == 0 {
				t.Fatalf("kustomize build %s: no objects", rel)
			}
			if len(objs.Secrets) > 0 {
				t.Errorf("kustomize build %s holds a Secret: apply -k would overwrite the real one", rel)
			}
		})
	}
	for _, rel := range []string{"base", "overlays/example"} {
		t.Run(rel+" objects", func(t *testing.T) {
			objs := build(t, rel)
			counts := map[string]int{
				"Deployment": len(objs.Deployments), "Service": len(objs.Services),
				"PodDisruptionBudget": len(objs.PodDisruptionBudgets), "ScaledObject": len(objs.ScaledObjects),
				"PodMonitor": len(objs.PodMonitors), "PrometheusRule": len(objs.PrometheusRules),
				"ServiceAccount": len(objs.ServiceAccounts), "ConfigMap": len(objs.ConfigMaps),
			}
			want := map[string]int{"Deployment": 1, "Service": 1, "PodDisruptionBudget": 1, "ScaledObject": 1,
				"PodMonitor": 1, "PrometheusRule": 1, "ServiceAccount": 1, "ConfigMap": 2}
			for kind, n := range want {
				if counts[kind] != n {
					t.Errorf("%s: %d %s, want %d", rel, counts[kind], kind, n)
				}
			}
			if len(objs.HPAs) > 0 {
				t.Errorf("%s: a HorizontalPodAutoscaler beside the ScaledObject: both would set the replicas", rel)
			}
			// The upgrade applies the ConfigMaps alone with
			// -l app.kubernetes.io/component=config (README).
			for _, cm := range objs.ConfigMaps {
				if cm.Labels["app.kubernetes.io/component"] != "config" {
					t.Errorf("%s: ConfigMap %s lacks the label app.kubernetes.io/component=config", rel, cm.Name)
				}
			}
			for _, d := range objs.Deployments {
				if d.Labels["app.kubernetes.io/component"] == "config" {
					t.Errorf("%s: Deployment %s is labelled component=config: a config-only apply would roll it", rel, d.Name)
				}
			}
		})
	}
}

// TestCPUAutoscalerComponent: the hpa-cpu component, added to the base or
// to the example overlay (as its comment says), replaces the ScaledObject
// and the KEDA TriggerAuthentication with a HorizontalPodAutoscaler of the
// worker's Deployment, capped at the events topic's partitions, as the
// ScaledObject is. Before, with the overlay, the HPA stayed at the base's
// 8 of the overlay's 12 partitions and the TriggerAuthentication stayed,
// which a cluster without KEDA refuses (new-user trial).
func TestCPUAutoscalerComponent(t *testing.T) {
	for _, on := range []string{"base", "overlays/example"} {
		t.Run(on, func(t *testing.T) {
			// A copy of the manifests where the overlay (a kustomization
			// beside it, for the base) takes the component as the
			// overlay's comment says.
			tmp := t.TempDir()
			if err := os.CopyFS(tmp, os.DirFS(dir(t))); err != nil {
				t.Fatal(err)
			}
			k := filepath.Join(tmp, "with-hpa", "kustomization.yaml")
			content := "resources: [../base]\ncomponents: [../hpa-cpu]\n"
			if on != "base" {
				k = filepath.Join(tmp, on, "kustomization.yaml")
				b, err := os.ReadFile(k)
				if err != nil {
					t.Fatal(err)
				}
				content = strings.Replace(string(b), "# components:\n#   - ../../hpa-cpu\n", "components:\n  - ../../hpa-cpu\n", 1)
				if content == string(b) {
					t.Fatalf("%s has no commented-out hpa-cpu component to take", k)
				}
			}
			if err := os.MkdirAll(filepath.Dir(k), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(k, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			objs, err := deploytest.Build(filepath.Dir(k))
			if err != nil {
				t.Fatal(err)
			}
			if len(objs.ScaledObjects) != 0 || len(objs.TriggerAuthentications) != 0 || len(objs.HPAs) != 1 {
				t.Fatalf("%s + hpa-cpu: %d ScaledObjects, %d TriggerAuthentications and %d HorizontalPodAutoscalers, want 0, 0 and 1",
					on, len(objs.ScaledObjects), len(objs.TriggerAuthentications), len(objs.HPAs))
			}
			hpa, d := objs.HPAs[0], objs.Deployments[0]
			if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != d.Name || ref.APIVersion != "apps/v1" {
				t.Errorf("HPA scales %s %s %s, want apps/v1 Deployment %s", ref.APIVersion, ref.Kind, ref.Name, d.Name)
			}
			if max := int(hpa.Spec.MaxReplicas); max != partitions(t, objs) {
				t.Errorf("HPA maxReplicas %d, want EVENTS_PARTITIONS %d: more pods would get no partition, fewer would leave partitions to share", max, partitions(t, objs))
			}
			for _, m := range hpa.Spec.Metrics {
				if m.Resource == nil || m.Resource.Name != corev1.ResourceCPU {
					t.Errorf("HPA metric %+v, want CPU only", m)
				}
			}
			if d.Spec.Template.Spec.Containers[0].Resources.Requests.Cpu().IsZero() {
				t.Error("a CPU HPA needs a CPU request on the worker")
			}
		})
	}
}

// partitions returns EVENTS_PARTITIONS of the settings ConfigMap.
func partitions(t *testing.T, objs *deploytest.Objects) int {
	t.Helper()
	cm := objs.ConfigMap("projection-worker-settings")
	if cm == nil {
		t.Fatal("no ConfigMap projection-worker-settings")
	}
	n, err := strconv.Atoi(cm.Data["EVENTS_PARTITIONS"])
	if err != nil {
		t.Fatalf("EVENTS_PARTITIONS: %v", err)
	}
	return n
}

// TestWorkerPodSpec checks the requirements on the worker's pod in
// the base and the overlay: non-root, read-only root filesystem, no
// capabilities, seccomp RuntimeDefault; requests and a memory limit, with
// no GOMEMLIMIT (the worker sets 90 % of that limit itself); no replicas field (the
// autoscaler owns it); the Service, PDB, PodMonitor and ScaledObject select
// or name the worker's pods and port.
func TestWorkerPodSpec(t *testing.T) {
	for _, rel := range []string{"base", "overlays/example"} {
		t.Run(rel, func(t *testing.T) {
			objs := build(t, rel)
			d := objs.Deployments[0]
			pod := d.Spec.Template.Spec
			if d.Spec.Replicas != nil {
				t.Errorf("Deployment sets replicas %d: each kubectl apply would reset what the autoscaler chose", *d.Spec.Replicas)
			}
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(pod.Containers))
			}
			c := pod.Containers[0]
			psc, sc := pod.SecurityContext, c.SecurityContext
			switch {
			case psc == nil || sc == nil:
				t.Fatal("pod or container securityContext missing")
			case psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0:
				t.Error("pod securityContext: want runAsNonRoot and a non-zero runAsUser")
			case psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Error("pod securityContext: want seccompProfile RuntimeDefault")
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Error("container: want readOnlyRootFilesystem")
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Error("container: want allowPrivilegeEscalation false")
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Error("container: want capabilities drop [ALL], none added")
			}
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Error("the worker never calls the Kubernetes API: want automountServiceAccountToken false")
			}
			limit := c.Resources.Limits.Memory()
			if limit.IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
				t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
			}
			// The worker sets Go's soft limit to 90 % of the container's
			// memory limit itself (setMemoryLimit); a GOMEMLIMIT from the
			// limit (100 %) would override that and leave no room for what
			// is not heap (new-user trial).
			for _, e := range c.Env {
				if e.Name == "GOMEMLIMIT" {
					t.Errorf("GOMEMLIMIT set (%+v): the worker's own 90 %% of the memory limit would not apply", e)
				}
			}

			podLabels := labels.Set(d.Spec.Template.Labels)
			selects := func(what string, sel map[string]string) {
				t.Helper()
				if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(podLabels) {
					t.Errorf("%s selector %v does not select the worker's pods %v", what, sel, podLabels)
				}
			}
			selects("Deployment", d.Spec.Selector.MatchLabels)
			selects("Service", objs.Services[0].Spec.Selector)
			selects("PodDisruptionBudget", objs.PodDisruptionBudgets[0].Spec.Selector.MatchLabels)
			selects("PodMonitor", objs.PodMonitors[0].Spec.Selector.MatchLabels)
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if svc := objs.Services[0]; !svc.Spec.PublishNotReadyAddresses {
				t.Error("metrics Service: want publishNotReadyAddresses, so that a pod failing /readyz is still scraped")
			}
			for _, p := range objs.Services[0].Spec.Ports {
				if _, ok := ports[p.TargetPort.String()]; !ok {
					t.Errorf("Service targetPort %s is not a port of the container (%v)", p.TargetPort.String(), ports)
				}
			}
			for _, e := range objs.PodMonitors[0].Spec.PodMetricsEndpoints {
				if e.Port == nil || ports[*e.Port] == 0 || e.Path != "/metrics" {
					t.Errorf("PodMonitor endpoint port %v path %q: want a container port and /metrics", e.Port, e.Path)
				}
			}
			pdb := objs.PodDisruptionBudgets[0]
			if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
				t.Error("PodDisruptionBudget: want maxUnavailable or minAvailable")
			}
			so := objs.ScaledObjects[0]
			if so.Spec.ScaleTargetRef == nil || so.Spec.ScaleTargetRef.Name != d.Name || (so.Spec.ScaleTargetRef.Kind != "" && so.Spec.ScaleTargetRef.Kind != "Deployment") {
				t.Errorf("ScaledObject scaleTargetRef %+v, want Deployment %s", so.Spec.ScaleTargetRef, d.Name)
			}
			if so.Spec.MaxReplicaCount == nil || int(*so.Spec.MaxReplicaCount) > partitions(t, objs) {
				t.Errorf("ScaledObject maxReplicaCount %v: want it set, <= EVENTS_PARTITIONS %d", so.Spec.MaxReplicaCount, partitions(t, objs))
			}
		})
	}
}

// TestKafkaTriggers: each ScaledObject trigger is a kafka trigger whose
// metadata keys are the kafka scaler's, with values it accepts, and whose
// TriggerAuthentication exists and gives only kafka parameters from keys of
// the Secret example.
func TestKafkaTriggers(t *testing.T) {
	secret, err := deploytest.DecodeFile(filepath.Join(dir(t), "secret.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"base", "overlays/example"} {
		t.Run(rel, func(t *testing.T) {
			objs := build(t, rel)
			for _, tr := range objs.ScaledObjects[0].Spec.Triggers {
				if tr.Type != "kafka" {
					t.Errorf("trigger type %q, want kafka", tr.Type)
					continue
				}
				for _, key := range []string{"bootstrapServers", "consumerGroup", "topic", "lagThreshold"} {
					if tr.Metadata[key] == "" {
						t.Errorf("kafka trigger without %s", key)
					}
				}
				for key, v := range tr.Metadata {
					allowed, known := deploytest.KafkaTriggerMetadata[key]
					switch {
					case !known:
						t.Errorf("kafka trigger metadata %q is not a kafka scaler setting", key)
					case slices.Equal(allowed, []string{"integer"}):
						if _, err := strconv.ParseInt(v, 10, 64); err != nil {
							t.Errorf("kafka trigger %s = %q, want an integer", key, v)
						}
					case allowed != nil && !slices.Contains(allowed, v):
						t.Errorf("kafka trigger %s = %q, want one of %v", key, v, allowed)
					}
				}
				if tr.AuthenticationRef == nil {
					continue
				}
				var found bool
				for _, ta := range objs.TriggerAuthentications {
					if ta.Name != tr.AuthenticationRef.Name {
						continue
					}
					found = true
					for _, ref := range ta.Spec.SecretTargetRef {
						if !slices.Contains(deploytest.KafkaAuthParameters, ref.Parameter) {
							t.Errorf("TriggerAuthentication parameter %q is not one of the kafka scaler's %v", ref.Parameter, deploytest.KafkaAuthParameters)
						}
						if ref.Name != secret.Secrets[0].Name || secret.Secrets[0].StringData[ref.Key] == "" {
							t.Errorf("TriggerAuthentication reads %s/%s: not a key of the Secret example", ref.Name, ref.Key)
						}
					}
				}
				if !found {
					t.Errorf("authenticationRef %q: no such TriggerAuthentication", tr.AuthenticationRef.Name)
				}
			}
		})
	}
}

// TestSecretKeysAreTheExamples: every key of the Secret that the
// Deployment and the Jobs read (secretKeyRef, not optional) is a key of
// secret.example.yaml, so that a Secret made from it has them all (ops
// trial: the migrate Job read the worker's DATABASE_URL, whose role may not
// create tables), and the migrator's Secret is the migrate Job's alone.
func TestSecretKeysAreTheExamples(t *testing.T) {
	secret, err := deploytest.DecodeFile(filepath.Join(dir(t), "secret.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]map[string]string{} // Secret → its keys
	for _, sec := range secret.Secrets {
		keys[sec.Name] = sec.StringData
	}
	var specs []corev1.PodSpec
	specs = append(specs, build(t, "overlays/example").Deployments[0].Spec.Template.Spec)
	for _, name := range []string{"migrate", "replay-dry-run", "replay-retry"} {
		specs = append(specs, build(t, "overlays/example/jobs/"+name).Jobs[0].Spec.Template.Spec)
	}
	read := map[string]bool{}
	for _, spec := range specs {
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			for _, e := range c.Env {
				ref := e.ValueFrom
				if ref == nil || ref.SecretKeyRef == nil || (ref.SecretKeyRef.Optional != nil && *ref.SecretKeyRef.Optional) {
					continue
				}
				read[ref.SecretKeyRef.Name+"/"+ref.SecretKeyRef.Key] = true
				if keys[ref.SecretKeyRef.Name][ref.SecretKeyRef.Key] == "" {
					t.Errorf("container %s reads %s/%s: not a key of the Secret example", c.Name, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key)
				}
			}
		}
	}
	if !read["projection-worker-migrate/DATABASE_URL"] {
		t.Errorf("Secret keys read %v: want the migrator's projection-worker-migrate/DATABASE_URL (the migrate Job)", read)
	}
	// The migrator's password in no pod of the worker.
	for _, f := range specs[0].Containers[0].EnvFrom {
		if f.SecretRef != nil && f.SecretRef.Name == "projection-worker-migrate" {
			t.Errorf("the worker's pods read the migrator's Secret")
		}
	}
}

// TestJobs: the one-shot Jobs run to completion once (restartPolicy Never,
// a backoffLimit, a deadline, cleaned up by ttlSecondsAfterFinished), with
// the worker's hardening, and use the worker's image in each kustomization
// of the overlay.
func TestJobs(t *testing.T) {
	image := build(t, "overlays/example").Deployments[0].Spec.Template.Spec.Containers[0].Image
	for _, name := range []string{"migrate", "replay-dry-run", "replay-retry"} {
		t.Run(name, func(t *testing.T) {
			objs := build(t, "overlays/example/jobs/"+name)
			if len(objs.Jobs) != 1 {
				t.Fatalf("%d Jobs, want 1", len(objs.Jobs))
			}
			j := objs.Jobs[0]
			pod := j.Spec.Template.Spec
			if pod.RestartPolicy != corev1.RestartPolicyNever || j.Spec.BackoffLimit == nil ||
				j.Spec.TTLSecondsAfterFinished == nil || j.Spec.ActiveDeadlineSeconds == nil {
				t.Error("want restartPolicy Never, backoffLimit, activeDeadlineSeconds and ttlSecondsAfterFinished")
			}
			if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
				t.Error("pod securityContext: want runAsNonRoot")
			}
			for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
				if c.Image != image {
					t.Errorf("container %s image %q, want the worker's %q", c.Name, c.Image, image)
				}
				if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
					!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
					t.Errorf("container %s: want readOnlyRootFilesystem, no privilege escalation, capabilities drop [ALL]", c.Name)
				}
				if c.Resources.Limits.Memory().IsZero() {
					t.Errorf("container %s: no memory limit", c.Name)
				}
			}
		})
	}
}

// TestReadmeNamesEveryAlert: the README's alert table has a line for each
// alert of the PrometheusRule.
func TestReadmeNamesEveryAlert(t *testing.T) {
	root, err := deploytest.Root()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range build(t, "base").PrometheusRules[0].Spec.Groups {
		for _, r := range g.Rules {
			if !strings.Contains(string(readme), "`"+r.Alert+"`") {
				t.Errorf("README.md does not name the alert `%s`", r.Alert)
			}
		}
	}
}
