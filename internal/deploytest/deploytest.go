// Package deploytest loads the Kubernetes manifests of deploy/kubernetes for
// the tests: it builds a kustomization with the kustomize Go API and decodes
// every object strictly (an unknown or duplicate field is an error) into its
// Go type, k8s.io/api's for the built-in kinds, the Prometheus Operator's for
// PodMonitor and PrometheusRule, and this package's KEDA types. Only tests
// import it: the k8s and kustomize modules stay out of the commands.
package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Objects are the decoded objects of one kustomize build or manifest file,
// by kind, in their order there. Each list's tag names the apiVersion and
// kind it holds.
type Objects struct {
	Deployments            []*appsv1.Deployment                     `kind:"apps/v1 Deployment"`
	Jobs                   []*batchv1.Job                           `kind:"batch/v1 Job"`
	ConfigMaps             []*corev1.ConfigMap                      `kind:"v1 ConfigMap"`
	Secrets                []*corev1.Secret                         `kind:"v1 Secret"`
	Services               []*corev1.Service                        `kind:"v1 Service"`
	ServiceAccounts        []*corev1.ServiceAccount                 `kind:"v1 ServiceAccount"`
	PodDisruptionBudgets   []*policyv1.PodDisruptionBudget          `kind:"policy/v1 PodDisruptionBudget"`
	HPAs                   []*autoscalingv2.HorizontalPodAutoscaler `kind:"autoscaling/v2 HorizontalPodAutoscaler"`
	ScaledObjects          []*ScaledObject                          `kind:"keda.sh/v1alpha1 ScaledObject"`
	TriggerAuthentications []*TriggerAuthentication                 `kind:"keda.sh/v1alpha1 TriggerAuthentication"`
	PodMonitors            []*monitoringv1.PodMonitor               `kind:"monitoring.coreos.com/v1 PodMonitor"`
	PrometheusRules        []*monitoringv1.PrometheusRule           `kind:"monitoring.coreos.com/v1 PrometheusRule"`
	// Count is the number of objects decoded.
	Count int
}

// ConfigMap returns the ConfigMap named name, or nil.
func (o *Objects) ConfigMap(name string) *corev1.ConfigMap {
	for _, cm := range o.ConfigMaps {
		if cm.Name == name {
			return cm
		}
	}
	return nil
}

// Job returns the Job named name, or nil.
func (o *Objects) Job(name string) *batchv1.Job {
	for _, j := range o.Jobs {
		if j.Name == name {
			return j
		}
	}
	return nil
}

// Root returns the repository root: the nearest directory above the working
// directory (a package's, under go test) that holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Dir returns deploy/kubernetes of the repository.
func Dir() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "kubernetes"), nil
}

// Kustomizations returns the directories below dir that hold a
// kustomization.yaml, sorted, with the Kustomization or Component each
// decodes strictly into.
func Kustomizations(dir string) (map[string]*types.Kustomization, error) {
	found := map[string]*types.Kustomization{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var k types.Kustomization
		if err := yaml.UnmarshalStrict(data, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		found[filepath.Dir(path)] = &k
		return nil
	})
	return found, err
}

// Build runs kustomize build on dir with the kustomize Go API and decodes
// the output strictly.
func Build(dir string) (*Objects, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	objs := &Objects{}
	for _, r := range resources.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		if err := objs.add(y); err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
	}
	return objs, nil
}

// DecodeFile decodes every document of a manifest file strictly.
func DecodeFile(path string) (*Objects, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs := &Objects{}
	for i, doc := range splitDocuments(data) {
		if err := objs.add(doc); err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", path, i+1, err)
		}
	}
	return objs, nil
}

// splitDocuments splits a YAML stream at its "---" lines and drops the
// documents that hold only comments.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	for _, doc := range bytes.Split(append([]byte("\n"), data...), []byte("\n---")) {
		empty := true
		for _, line := range strings.Split(string(doc), "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, doc)
		}
	}
	return docs
}

// add decodes one object strictly into the type of its apiVersion and kind:
// that of the Objects list tagged with them.
func (o *Objects) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	kind := tm.APIVersion + " " + tm.Kind
	v := reflect.ValueOf(o).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).Tag.Get("kind") != kind {
			continue
		}
		list := v.Field(i)
		obj := reflect.New(list.Type().Elem().Elem())
		if err := yaml.UnmarshalStrict(doc, obj.Interface()); err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		list.Set(reflect.Append(list, obj))
		o.Count++
		return nil
	}
	return fmt.Errorf("apiVersion %q kind %q: no Go type known here (add it to deploytest.Objects)", tm.APIVersion, tm.Kind)
}

// ManifestFiles returns the YAML files below dir that hold Kubernetes
// objects or patches of them: every .yaml file except kustomization.yaml and
// the data files the kustomizations read (configMapGenerator files, the
// projection definitions) or the tests use (promtool's unit tests).
func ManifestFiles(dir string, kustomizations map[string]*types.Kustomization) ([]string, error) {
	data := map[string]bool{}
	for kdir, k := range kustomizations {
		for _, g := range k.ConfigMapGenerator {
			for _, f := range append(append([]string{}, g.FileSources...), g.EnvSources...) {
				if _, path, ok := strings.Cut(f, "="); ok {
					f = path
				}
				data[filepath.Join(kdir, f)] = true
			}
		}
	}
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" || d.Name() == "kustomization.yaml" || data[path] {
			return err
		}
		if strings.HasSuffix(path, "_test.yaml") {
			return nil
		}
		files = append(files, path)
		return nil
	})
	sort.Strings(files)
	return files, err
}
