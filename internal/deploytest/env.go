package deploytest

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/causet/projection-worker/internal/flagenv"
)

// PodName stands for the downward API's metadata.name in ResolveEnv.
const PodName = "projection-worker-7d9f8c6b5-x2k9q"

// Env is a container's environment as the kubelet would set it.
type Env struct {
	// Values are the variables by name.
	Values map[string]string
	// Explicit are the names the container's env list sets; the others come
	// from envFrom.
	Explicit []string
}

// Lookup is os.LookupEnv over the Values, for flagenv.Set.WithLookup.
func (e Env) Lookup(k string) (string, bool) { v, ok := e.Values[k]; return v, ok }

// Names returns the names of the Values.
func (e Env) Names() []string {
	names := make([]string, 0, len(e.Values))
	for k := range e.Values {
		names = append(names, k)
	}
	return names
}

// ResolveEnv returns the environment of container c: its envFrom and env,
// with ConfigMaps from configMaps (the worker's, for a Job built on its own),
// Secret keys from secrets (the example), metadata.name as PodName and a
// resourceFieldRef as the container's limit in the ref's unit (bytes for a
// divisor of 1). A missing ConfigMap or Secret, or a missing key that is not
// optional, is an error.
func ResolveEnv(configMaps *Objects, secrets []*corev1.Secret, c corev1.Container) (Env, error) {
	env := Env{Values: map[string]string{}}
	configMap := func(name string) (map[string]string, error) {
		cm := configMaps.ConfigMap(name)
		if cm == nil {
			return nil, fmt.Errorf("container %s reads ConfigMap %q, which the kustomization does not make", c.Name, name)
		}
		return cm.Data, nil
	}
	fromSecret := func(name string) (map[string]string, error) {
		for _, sec := range secrets {
			if sec.Name == name {
				return sec.StringData, nil
			}
		}
		return nil, fmt.Errorf("container %s reads Secret %q, which secret.example.yaml does not hold", c.Name, name)
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		var err error
		switch {
		case from.ConfigMapRef != nil:
			data, err = configMap(from.ConfigMapRef.Name)
		case from.SecretRef != nil:
			data, err = fromSecret(from.SecretRef.Name)
		}
		if err != nil {
			return env, err
		}
		for k, v := range data {
			env.Values[from.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		env.Explicit = append(env.Explicit, e.Name)
		var data map[string]string
		var key string
		var optional *bool
		var err error
		switch src := e.ValueFrom; {
		case src == nil:
			env.Values[e.Name] = e.Value
			continue
		case src.ConfigMapKeyRef != nil:
			data, err = configMap(src.ConfigMapKeyRef.Name)
			key, optional = src.ConfigMapKeyRef.Key, src.ConfigMapKeyRef.Optional
		case src.SecretKeyRef != nil:
			data, err = fromSecret(src.SecretKeyRef.Name)
			key, optional = src.SecretKeyRef.Key, src.SecretKeyRef.Optional
		case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.name":
			env.Values[e.Name] = PodName
			continue
		case src.ResourceFieldRef != nil:
			q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(src.ResourceFieldRef.Resource, "limits."))]
			div := src.ResourceFieldRef.Divisor.Value()
			if div == 0 {
				div = 1
			}
			env.Values[e.Name] = fmt.Sprint(q.Value() / div)
			continue
		default:
			return env, fmt.Errorf("container %s: %s has a source this package does not resolve: %+v", c.Name, e.Name, src)
		}
		if err != nil {
			return env, err
		}
		v, ok := data[key]
		if !ok && (optional == nil || !*optional) {
			return env, fmt.Errorf("container %s: %s reads key %s, which is missing", c.Name, e.Name, key)
		}
		if ok {
			env.Values[e.Name] = v
		}
	}
	return env, nil
}

// ExampleSecrets returns the Secrets of deploy/kubernetes/secret.example.yaml.
func ExampleSecrets() ([]*corev1.Secret, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	objs, err := DecodeFile(filepath.Join(dir, "secret.example.yaml"))
	if err != nil {
		return nil, err
	}
	if len(objs.Secrets) == 0 {
		return nil, fmt.Errorf("secret.example.yaml holds no Secret")
	}
	return objs.Secrets, nil
}

// RuntimeEnv are variables the Go runtime reads, not the flags.
var RuntimeEnv = []string{"GOMEMLIMIT", "GOGC", "GOMAXPROCS"}

// Unread returns the names that no flag of fs reads from the environment and
// that are not RuntimeEnv: misspelt or stale variables.
func Unread(fs *flagenv.Set, names []string) []string {
	read := map[string]bool{}
	for _, env := range fs.Env() {
		read[env] = true
	}
	var unread []string
	for _, n := range names {
		if !read[n] && !slices.Contains(RuntimeEnv, n) {
			unread = append(unread, n)
		}
	}
	slices.Sort(unread)
	return unread
}
