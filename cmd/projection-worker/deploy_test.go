package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/causet/projection-worker/internal/deploytest"
	"github.com/causet/projection-worker/internal/flagenv"
	"github.com/causet/projection-worker/internal/testtool"
	"github.com/causet/projection-worker/projection"
)

// The tests of this file hold deploy/kubernetes to the worker's own code:
// the environment and arguments of its containers parse with the commands'
// flag sets, the probes, port, grace period and autoscaler agree with what
// that parse yields, and every metric the alerts use is served by a running
// worker.

// deployObjects builds deploy/kubernetes/rel with kustomize.
func deployObjects(t *testing.T, rel string) *deploytest.Objects {
	t.Helper()
	dir, err := deploytest.Dir()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploytest.Build(filepath.Join(dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// containerEnv returns the environment of container c; see
// deploytest.ResolveEnv.
func containerEnv(t *testing.T, configMaps *deploytest.Objects, c corev1.Container) deploytest.Env {
	t.Helper()
	env := exampleSecretEnv(t, configMaps, c)
	if env.Values["KAFKA_SASL_MECHANISM"] == "" {
		// Brokers without SASL: the real Secret leaves the two keys out,
		// as secret.example.yaml says (with them, run refuses to start:
		// TestDeploySASLKeysWithoutAMechanismAreRefused).
		delete(env.Values, "KAFKA_SASL_USER")
		delete(env.Values, "KAFKA_SASL_PASSWORD")
	}
	return env
}

// exampleSecretEnv is c's environment with secret.example.yaml as its
// Secrets, every key of them kept.
func exampleSecretEnv(t *testing.T, configMaps *deploytest.Objects, c corev1.Container) deploytest.Env {
	t.Helper()
	secrets, err := deploytest.ExampleSecrets()
	if err != nil {
		t.Fatal(err)
	}
	env, err := deploytest.ResolveEnv(configMaps, secrets, c)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// TestDeploySASLKeysWithoutAMechanismAreRefused: the base (no
// KAFKA_SASL_MECHANISM) with a Secret that keeps secret.example.yaml's
// KAFKA_SASL_ keys is refused at start, naming the flags, rather than run
// without authenticating (new-user trial: the credentials were dropped).
func TestDeploySASLKeysWithoutAMechanismAreRefused(t *testing.T) {
	clearSettingsEnv(t)
	objs := deployObjects(t, "base")
	c := objs.Deployments[0].Spec.Template.Spec.Containers[0]
	env := exampleSecretEnv(t, objs, c)
	if env.Values["KAFKA_SASL_MECHANISM"] != "" || env.Values["KAFKA_SASL_USER"] == "" {
		t.Fatalf("the base sets a SASL mechanism, or the example Secret no user: the test no longer shows what it should")
	}
	var s settings
	if err := parseFlags(runFlags(&s, io.Discard).WithLookup(env.Lookup), c.Args[1:]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kafka.Opts(); err == nil || !strings.Contains(err.Error(), "without --kafka-sasl-mechanism") {
		t.Errorf("kafka settings error %v, want one saying the SASL user is set without a mechanism", err)
	}
}

// checkEnvRead fails t for each variable of names that fs does not read.
func checkEnvRead(t *testing.T, what string, fs *flagenv.Set, names []string) {
	t.Helper()
	for _, n := range deploytest.Unread(fs, names) {
		t.Errorf("%s sets %s, which %s does not read (a misspelt or stale variable)", what, n, fs.Name())
	}
}

// workerSettings parses the worker container of objs as `projection-worker
// run` would, and returns the settings with its container.
func workerSettings(t *testing.T, objs *deploytest.Objects) (*settings, corev1.Container) {
	t.Helper()
	c := objs.Deployments[0].Spec.Template.Spec.Containers[0]
	env := containerEnv(t, objs, c)
	if len(c.Command) > 0 || len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("worker container runs %q %q, want the entrypoint with args [run ...]", c.Command, c.Args)
	}
	var s settings
	fs := runFlags(&s, io.Discard).WithLookup(env.Lookup)
	if err := parseFlags(fs, c.Args[1:]); err != nil {
		t.Fatalf("worker args %q with its environment: %v", c.Args, err)
	}
	checkEnvRead(t, "the worker container", fs, env.Names())
	return &s, c
}

// TestDeployWorkerSettings: the worker's container, as built by the base and
// the overlay, parses with `run`'s flag set and passes its checks (no usage
// error); every variable it sets is one `run` reads; POD_NAME becomes
// --worker-id; the definitions file is in the mounted projections ConfigMap
// and loads; the probes ask /healthz and /readyz on the port --http-addr
// listens on; the grace period exceeds --shutdown-grace with the time the
// HTTP server and telemetry take to stop; the ScaledObject watches the
// worker's topic, group and brokers, with its SASL and TLS, and never adds
// more pods than partitions.
func TestDeployWorkerSettings(t *testing.T) {
	clearSettingsEnv(t)
	for _, rel := range []string{"base", "overlays/example"} {
		t.Run(rel, func(t *testing.T) {
			objs := deployObjects(t, rel)
			s, c := workerSettings(t, objs)
			pod := objs.Deployments[0].Spec.Template.Spec
			if _, err := s.topicConfig(); err != nil {
				t.Errorf("topics: %v", err)
			}
			if err := s.checkRun(); err != nil {
				t.Errorf("run settings: %v", err)
			}
			if _, err := s.retryPolicy(); err != nil {
				t.Errorf("retry settings: %v", err)
			}
			if _, err := s.kafka.Opts(); err != nil {
				t.Errorf("kafka settings: %v", err)
			}
			if _, err := s.logger(io.Discard); err != nil {
				t.Errorf("log settings: %v", err)
			}
			if err := s.requireDatabase(); err != nil {
				t.Errorf("database: %v", err)
			}
			if _, err := poolConfig(s.databaseURL, 0); err != nil {
				t.Errorf("DATABASE_URL of the Secret example: %v", err)
			}
			if s.workerID != deploytest.PodName {
				t.Errorf("--worker-id = %q, want the pod name from POD_NAME", s.workerID)
			}
			checkProjectionsMount(t, objs, pod, c, s.projections)

			_, port, err := net.SplitHostPort(s.httpAddr)
			if err != nil {
				t.Fatalf("--http-addr %q: %v", s.httpAddr, err)
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			probes := []struct {
				name string
				p    *corev1.Probe
				path string
			}{{"startupProbe", c.StartupProbe, "/healthz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}}
			for _, pr := range probes {
				if pr.p == nil || pr.p.HTTPGet == nil {
					t.Errorf("%s: want an httpGet probe of %s", pr.name, pr.path)
					continue
				}
				got := pr.p.HTTPGet.Port.IntVal
				if pr.p.HTTPGet.Port.StrVal != "" {
					got = ports[pr.p.HTTPGet.Port.StrVal]
				}
				if pr.p.HTTPGet.Path != pr.path || fmt.Sprint(got) != port {
					t.Errorf("%s asks %s on port %d, want %s on %s (--http-addr %s)", pr.name, pr.p.HTTPGet.Path, got, pr.path, port, s.httpAddr)
				}
			}

			// serve: the worker's Run returns within --shutdown-grace, then
			// the HTTP server gets 2s and telemetry 5s to stop.
			const afterRun = 7 * time.Second
			grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
			if grace <= s.shutdownGrace+afterRun {
				t.Errorf("terminationGracePeriodSeconds %s <= --shutdown-grace %s + %s: SIGKILL could cut the final commit", grace, s.shutdownGrace, afterRun)
			}

			// /healthz answers once Kafka has: the startup probe must outlast
			// --kafka-start-timeout, or the kubelet restarts a worker that
			// was still waiting for Kafka instead of letting it say why.
			if sp := c.StartupProbe; sp != nil {
				window := time.Duration(sp.PeriodSeconds*sp.FailureThreshold) * time.Second
				if window <= s.kafkaStartTimeout {
					t.Errorf("startupProbe window %s <= --kafka-start-timeout %s", window, s.kafkaStartTimeout)
				}
			}

			so := objs.ScaledObjects[0]
			if int(*so.Spec.MaxReplicaCount) > s.partitions {
				t.Errorf("maxReplicaCount %d > --partitions %d", *so.Spec.MaxReplicaCount, s.partitions)
			}
			for _, tr := range so.Spec.Triggers {
				m := tr.Metadata
				if m["topic"] != s.topic || m["consumerGroup"] != s.group || m["bootstrapServers"] != s.kafka.Brokers {
					t.Errorf("kafka trigger watches topic %q group %q brokers %q; the worker reads topic %q in group %q from %q",
						m["topic"], m["consumerGroup"], m["bootstrapServers"], s.topic, s.group, s.kafka.Brokers)
				}
				wantSASL := map[string]string{"": "", "plain": "plaintext", "scram-sha-256": "scram_sha256", "scram-sha-512": "scram_sha512"}[s.kafka.SASLMechanism]
				if sasl := strings.TrimPrefix(m["sasl"], "none"); sasl != wantSASL {
					t.Errorf("kafka trigger sasl %q, want %q for the worker's --kafka-sasl-mechanism %q", m["sasl"], wantSASL, s.kafka.SASLMechanism)
				}
				if (m["tls"] == "enable") != s.kafka.TLS {
					t.Errorf("kafka trigger tls %q, the worker's --kafka-tls %t", m["tls"], s.kafka.TLS)
				}
				if m["offsetResetPolicy"] != "earliest" {
					t.Errorf("kafka trigger offsetResetPolicy %q: the worker's new group starts at the earliest offset (franz-go's default), so its lag counts from there", m["offsetResetPolicy"])
				}
			}
		})
	}
}

// checkProjectionsMount: file is a key of the ConfigMap mounted at its
// directory in container c, and that ConfigMap's definitions load.
func checkProjectionsMount(t *testing.T, objs *deploytest.Objects, pod corev1.PodSpec, c corev1.Container, file string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(file) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm := objs.ConfigMap(v.ConfigMap.Name)
			if cm == nil {
				t.Fatalf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			defs, ok := cm.Data[path.Base(file)]
			if !ok {
				t.Fatalf("ConfigMap %s has no key %s for --projections %s", cm.Name, path.Base(file), file)
			}
			local := writeFile(t, path.Base(file), defs)
			if _, _, err := loadProjections(local); err != nil {
				t.Errorf("the definitions of ConfigMap %s do not load: %v", cm.Name, err)
			}
			return
		}
	}
	t.Errorf("container %s: --projections %s is not in a mounted ConfigMap", c.Name, file)
}

// TestDeployMigrateJob: the topics+migrate Job's containers parse with the
// `topics` and `migrate` flag sets and the worker's ConfigMaps: topics makes
// the worker's topics with its partitions; migrate gets the database, the
// definitions the worker loads and valid tenant schemas. Each variable a
// container sets itself is read by its command.
func TestDeployMigrateJob(t *testing.T) {
	clearSettingsEnv(t)
	worker := deployObjects(t, "overlays/example")
	ws, _ := workerSettings(t, worker)
	job := deployObjects(t, "overlays/example/jobs/migrate").Jobs[0]
	pod := job.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		t.Fatalf("%d init containers and %d containers, want topics then migrate", len(pod.InitContainers), len(pod.Containers))
	}

	topics := pod.InitContainers[0]
	env := containerEnv(t, worker, topics)
	var ts settings
	fs := topicsFlags(&ts, io.Discard).WithLookup(env.Lookup)
	if len(topics.Args) == 0 || topics.Args[0] != "topics" {
		t.Fatalf("init container args %q, want [topics ...]", topics.Args)
	}
	if err := parseFlags(fs, topics.Args[1:]); err != nil {
		t.Fatalf("topics args %q: %v", topics.Args, err)
	}
	checkEnvRead(t, "the topics container", fs, env.Explicit)
	got, err := ts.topicConfig()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ws.topicConfig()
	if got != want || !ts.kafka.SameConnection(ws.kafka) {
		t.Errorf("topics creates %+v on %s, the worker uses %+v on %s", got, ts.kafka, want, ws.kafka)
	}

	migrate := pod.Containers[0]
	env = containerEnv(t, worker, migrate)
	var ms settings
	fs = migrateFlags(&ms, io.Discard).WithLookup(env.Lookup)
	if len(migrate.Args) == 0 || migrate.Args[0] != "migrate" {
		t.Fatalf("container args %q, want [migrate ...]", migrate.Args)
	}
	if err := parseFlags(fs, migrate.Args[1:]); err != nil {
		t.Fatalf("migrate args %q: %v", migrate.Args, err)
	}
	checkEnvRead(t, "the migrate container", fs, env.Explicit)
	if err := ms.requireDatabase(); err != nil {
		t.Error(err)
	}
	// The worker's database and definitions, as the migrator (a role of
	// its own), granting the worker's role what run needs.
	mu, err1 := url.Parse(ms.databaseURL)
	wu, err2 := url.Parse(ws.databaseURL)
	if err1 != nil || err2 != nil || mu.Host != wu.Host || mu.Path != wu.Path || ms.projections != ws.projections {
		t.Errorf("migrate uses database %q and definitions %q, the worker %q and %q", ms.databaseURL, ms.projections, ws.databaseURL, ws.projections)
	}
	if wu != nil && ms.grantRole != wu.User.Username() {
		t.Errorf("migrate grants %q, want the worker's role %q (the user of its DATABASE_URL)", ms.grantRole, wu.User.Username())
	}
	checkProjectionsMount(t, worker, pod, migrate, ms.projections)
	if len(ms.tenantSchemas) == 0 {
		t.Error("migrate: no tenant schema (TENANT_SCHEMAS or --tenant-schema)")
	}
	for _, tenant := range ms.tenantSchemas {
		if !projection.ValidTenantSchema(tenant) {
			t.Errorf("migrate: tenant schema %q is not valid", tenant)
		}
	}
}

// alertMetricRE finds the identifiers of a PromQL expression once strings,
// label matchers, ranges and label lists are removed: metric names,
// functions, aggregations and keywords.
var (
	promqlStrip = []*regexp.Regexp{
		regexp.MustCompile(`"(?:[^"\\]|\\.)*"`),
		regexp.MustCompile(`\{[^}]*\}`),
		regexp.MustCompile(`\[[^\]]*\]`),
		regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
		regexp.MustCompile(`\boffset\s+\S+`),
	}
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlKeywords = []string{"and", "or", "unless", "bool", "inf", "nan"}
	promqlBy       = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
)

// promqlMetrics returns the metric names an expression selects.
func promqlMetrics(expr string) []string {
	for _, re := range promqlStrip {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(expr[loc[0]-1:loc[0]], "0123456789.") {
			continue // part of a number: 1e5
		}
		if strings.HasPrefix(strings.TrimLeft(expr[loc[1]:], " \t\n"), "(") || slices.Contains(promqlKeywords, strings.ToLower(name)) {
			continue // a function or aggregation call, or a keyword
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// externalMetrics are metrics an alert may use that another exporter
// serves: kube-state-metrics for pod readiness and creation time, and
// Prometheus itself for a target's scrapes (up).
var externalMetrics = []string{"kube_pod_status_ready", "kube_pod_created", "up"}

// targetLabels are labels Prometheus adds to every scraped series (the
// PodMonitor's target labels), not served by the worker.
var targetLabels = []string{"namespace", "pod"}

func TestPromqlMetrics(t *testing.T) {
	got := promqlMetrics(`(sum by (namespace, topic) (x_lag{a="b(c)"}) > 1e5) and (sum by (topic) (delta(y_total[15m] offset 5m)) > 0) unless on (pod) z == bool 1`)
	if want := []string{"x_lag", "y_total", "z"}; !slices.Equal(got, want) {
		t.Errorf("promqlMetrics = %q, want %q", got, want)
	}
}

// TestDeployAlertMetricsServed runs the worker in-process (kfake, a real
// PostgreSQL) on records it applies and dead-letters, scrapes its /metrics and
// checks: every metric of every alert (and of the alerts' promtool tests) is
// served, with the labels the alerts group by; `promtool check metrics`
// passes on the scrape; and the probes' paths answer 200 on that server.
func TestDeployAlertMetricsServed(t *testing.T) {
	w := startBusyWorker(t)
	// Scrape until the dead letter and the lag are counted.
	scrape, families := w.scrapeUntil(t, 60*time.Second, func(fs map[string]*dto.MetricFamily) bool {
		return fs["causet_projection_dead_lettered_total"] != nil && fs["causet_projection_consumer_lag"] != nil
	})
	addr := w.addr

	// Series names and the labels each has.
	served := map[string][]string{}
	for name, f := range families {
		names := []string{name}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{name + "_bucket", name + "_sum", name + "_count"}
		}
		for _, n := range names {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if !slices.Contains(served[n], l.GetName()) {
						served[n] = append(served[n], l.GetName())
					}
				}
			}
			if served[n] == nil {
				served[n] = []string{}
			}
		}
	}
	rule := deployObjects(t, "base").PrometheusRules[0]
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			expr := r.Expr.String()
			var by []string
			for _, m := range promqlBy.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "" && !slices.Contains(targetLabels, l) {
						by = append(by, l)
					}
				}
			}
			for _, metric := range promqlMetrics(expr) {
				if slices.Contains(externalMetrics, metric) {
					continue
				}
				labels, ok := served[metric]
				if !ok {
					t.Errorf("alert %s uses %s, which /metrics does not serve", r.Alert, metric)
					continue
				}
				for _, l := range by {
					if !slices.Contains(labels, l) {
						t.Errorf("alert %s groups %s by %q, a label it does not have (%v)", r.Alert, metric, l, labels)
					}
				}
			}
		}
	}
	dir, _ := deploytest.Dir()
	unitTests, err := os.ReadFile(filepath.Join(dir, "prometheus", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ut struct {
		Tests []struct {
			InputSeries []struct {
				Series string `json:"series"`
			} `json:"input_series"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(unitTests, &ut); err != nil {
		t.Fatal(err)
	}
	for _, tc := range ut.Tests {
		for _, in := range tc.InputSeries {
			name, _, _ := strings.Cut(in.Series, "{")
			if _, ok := served[name]; !ok && !slices.Contains(externalMetrics, name) {
				t.Errorf("alerts_test.yaml feeds %s, which /metrics does not serve", name)
			}
		}
	}

	// promtool's lint of the exposition format: names, units, help.
	cmd := exec.Command(testtool.Require(t, "promtool"), "check", "metrics")
	cmd.Stdin = bytes.NewReader(scrape)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	for _, p := range []string{"/healthz", "/readyz"} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + p)
			code := 0
			if err == nil {
				code = resp.StatusCode
				resp.Body.Close()
			}
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("GET %s = %d (%v), want 200", p, code, err)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// scrapeMetrics GETs /metrics of the worker at addr and parses it.
func scrapeMetrics(t *testing.T, addr string) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return body, families
}
