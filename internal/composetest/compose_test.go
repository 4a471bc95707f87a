// Package composetest checks docker-compose.kafka.yml without Docker: it
// parses the file as YAML and checks what the README tells users about it
// (service names, ports, images) and that the single-node KRaft broker is
// configured consistently.
package composetest

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const composeFile = "../../docker-compose.kafka.yml"

// compose is the part of the Compose file format the test reads.
type compose struct {
	Name     string             `yaml:"name"`
	Services map[string]service `yaml:"services"`
}

type service struct {
	Image       string       `yaml:"image"`
	Ports       []port       `yaml:"ports"`
	Environment environment  `yaml:"environment"`
	Healthcheck *healthcheck `yaml:"healthcheck"`
	DependsOn   dependsOn    `yaml:"depends_on"`
	Profiles    []string     `yaml:"profiles"`
}

type healthcheck struct {
	Test     any    `yaml:"test"`
	Interval string `yaml:"interval"`
	Disable  bool   `yaml:"disable"`
}

// port is one entry of a service's ports, in the short syntax
// ("[HOST_IP:]HOST:CONTAINER[/PROTOCOL]") or the long one.
type port struct {
	HostIP    string
	Published string
	Target    string
}

func (p *port) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		s, _, _ := strings.Cut(n.Value, "/")
		parts := strings.Split(s, ":")
		switch len(parts) {
		case 1:
			p.Target = parts[0]
		case 2:
			p.Published, p.Target = parts[0], parts[1]
		case 3:
			p.HostIP, p.Published, p.Target = parts[0], parts[1], parts[2]
		default:
			return fmt.Errorf("line %d: port %q", n.Line, n.Value)
		}
		return nil
	}
	var long struct {
		HostIP    string `yaml:"host_ip"`
		Published string `yaml:"published"`
		Target    string `yaml:"target"`
	}
	if err := n.Decode(&long); err != nil {
		return err
	}
	*p = port{HostIP: long.HostIP, Published: long.Published, Target: long.Target}
	return nil
}

// environment is a service's environment, given as a map or as a list of
// KEY=VALUE.
type environment map[string]string

func (e *environment) UnmarshalYAML(n *yaml.Node) error {
	*e = environment{}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			(*e)[n.Content[i].Value] = n.Content[i+1].Value
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			k, v, _ := strings.Cut(c.Value, "=")
			(*e)[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment is neither a map nor a list", n.Line)
	}
	return nil
}

// dependsOn maps a dependency to its condition ("" in the list syntax).
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	switch n.Kind {
	case yaml.SequenceNode:
		for _, c := range n.Content {
			(*d)[c.Value] = ""
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			var v struct {
				Condition string `yaml:"condition"`
			}
			if err := n.Content[i+1].Decode(&v); err != nil {
				return err
			}
			(*d)[n.Content[i].Value] = v.Condition
		}
	default:
		return fmt.Errorf("line %d: depends_on is neither a list nor a map", n.Line)
	}
	return nil
}

// load reads and parses the repository's compose file; it returns the raw
// text too.
func load(t *testing.T) (compose, string) {
	t.Helper()
	b, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := parse(string(b))
	if err != nil {
		t.Fatalf("%s is not a Compose file this test can read: %v", composeFile, err)
	}
	return c, string(b)
}

func parse(text string) (compose, error) {
	var c compose
	err := yaml.Unmarshal([]byte(text), &c)
	return c, err
}

// published returns the host port of s that forwards to container port
// target, and the host address it is bound to ("" for all).
func (s service) published(target string) (hostIP, hostPort string, ok bool) {
	for _, p := range s.Ports {
		if p.Target == target && p.Published != "" {
			return p.HostIP, p.Published, true
		}
	}
	return "", "", false
}

// problems collects what is wrong with a compose file.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// checkServices: the services, images and ports the README and the file's
// own header comment name: kafka on localhost:9092 (official apache/kafka
// image), postgres 16 on localhost:5432, and kcat.
func checkServices(c compose) problems {
	var p problems
	var names []string
	for name := range c.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{"kafka", "kcat", "postgres"}; !slices.Equal(names, want) {
		p.add("services = %q, want %q", names, want)
	}
	for _, want := range []struct {
		service     string
		imagePrefix string
		port        string // container port published on the same host port
	}{
		{"kafka", "apache/kafka:", "9092"},
		{"postgres", "postgres:16", "5432"},
		{"kcat", "edenhill/kcat:", ""},
	} {
		s, ok := c.Services[want.service]
		if !ok {
			p.add("no service %s", want.service)
			continue
		}
		if !strings.HasPrefix(s.Image, want.imagePrefix) {
			p.add("%s: image = %q, want %s...", want.service, s.Image, want.imagePrefix)
		}
		if _, tag, _ := strings.Cut(s.Image, ":"); tag == "" || tag == "latest" {
			p.add("%s: image %q: pin a version tag", want.service, s.Image)
		}
		if want.port == "" {
			continue
		}
		ip, hostPort, ok := s.published(want.port)
		switch {
		case !ok:
			p.add("%s: container port %s is not published; ports: %+v", want.service, want.port, s.Ports)
		case hostPort != want.port:
			p.add("%s: container port %s is published on host port %s, the README says %s", want.service, want.port, hostPort, want.port)
		case ip != "" && !net.ParseIP(ip).IsLoopback():
			p.add("%s: port %s is bound to %s; the README's localhost:%s needs a loopback address or none", want.service, want.port, ip, want.port)
		}
	}
	return p
}

// checkHealthchecks: kafka and postgres have healthchecks, so that
// `docker compose up --wait` and kcat's depends_on wait for them.
func checkHealthchecks(c compose) problems {
	var p problems
	for _, name := range []string{"kafka", "postgres"} {
		h := c.Services[name].Healthcheck
		if h == nil || h.Disable || h.Test == nil {
			p.add("service %s has no healthcheck", name)
			continue
		}
		if test, ok := h.Test.([]any); ok && (len(test) < 2 || test[0] == "NONE") {
			p.add("service %s: healthcheck test %q does nothing", name, test)
		}
	}
	if cond := c.Services["kcat"].DependsOn["kafka"]; cond != "service_healthy" {
		p.add("kcat depends_on kafka with condition %q, want service_healthy", cond)
	}
	return p
}

// checkKRaft: a single node that is broker and controller (KRaft, no
// ZooKeeper), whose listeners, advertised listeners, quorum and security
// map agree, advertising localhost:9092 to the host.
func checkKRaft(c compose) problems {
	var p problems
	env := c.Services["kafka"].Environment
	list := func(key string) []string {
		var out []string
		for _, v := range strings.Split(env[key], ",") {
			if v = strings.TrimSpace(v); v != "" {
				out = append(out, v)
			}
		}
		return out
	}
	roles := list("KAFKA_PROCESS_ROLES")
	slices.Sort(roles)
	if !slices.Equal(roles, []string{"broker", "controller"}) {
		p.add("KAFKA_PROCESS_ROLES = %q, want broker,controller", env["KAFKA_PROCESS_ROLES"])
	}
	for k := range env {
		if strings.Contains(k, "ZOOKEEPER") {
			p.add("%s set: KRaft mode has no ZooKeeper", k)
		}
	}
	nodeID := env["KAFKA_NODE_ID"]
	if _, err := strconv.Atoi(nodeID); err != nil {
		p.add("KAFKA_NODE_ID = %q, want a number", nodeID)
	}
	if voters := list("KAFKA_CONTROLLER_QUORUM_VOTERS"); len(voters) != 1 || !strings.HasPrefix(voters[0], nodeID+"@") {
		p.add("KAFKA_CONTROLLER_QUORUM_VOTERS = %q, want this node alone (%s@host:port)", env["KAFKA_CONTROLLER_QUORUM_VOTERS"], nodeID)
	}

	// Listeners: NAME://host:port.
	names := func(key string) map[string]string {
		out := map[string]string{}
		for _, l := range list(key) {
			name, addr, ok := strings.Cut(l, "://")
			if !ok {
				p.add("%s: %q is not NAME://host:port", key, l)
				continue
			}
			out[name] = addr
		}
		return out
	}
	listeners := names("KAFKA_LISTENERS")
	advertised := names("KAFKA_ADVERTISED_LISTENERS")
	protocols := map[string]string{}
	for _, m := range list("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP") {
		name, proto, _ := strings.Cut(m, ":")
		protocols[name] = proto
	}
	for name := range listeners {
		if protocols[name] == "" {
			p.add("listener %s has no entry in KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", name)
		}
	}
	controllers := list("KAFKA_CONTROLLER_LISTENER_NAMES")
	if len(controllers) == 0 {
		p.add("KAFKA_CONTROLLER_LISTENER_NAMES is not set")
	}
	for _, name := range controllers {
		if _, ok := listeners[name]; !ok {
			p.add("controller listener %s is not in KAFKA_LISTENERS", name)
		}
		if _, ok := advertised[name]; ok {
			p.add("controller listener %s is advertised to clients", name)
		}
	}
	if ib := env["KAFKA_INTER_BROKER_LISTENER_NAME"]; ib != "" {
		if _, ok := advertised[ib]; !ok {
			p.add("inter-broker listener %s is not advertised", ib)
		}
	}
	hostListener := ""
	for name, addr := range advertised {
		if _, ok := listeners[name]; !ok {
			p.add("advertised listener %s is not in KAFKA_LISTENERS", name)
		}
		if addr == "localhost:9092" || addr == "127.0.0.1:9092" {
			hostListener = name
		}
	}
	if hostListener == "" {
		p.add("KAFKA_ADVERTISED_LISTENERS = %q: nothing advertises localhost:9092, the address the README gives clients on the host", env["KAFKA_ADVERTISED_LISTENERS"])
	} else if _, port, _ := net.SplitHostPort(listeners[hostListener]); port != "9092" {
		p.add("listener %s advertises localhost:9092 but listens on %q", hostListener, listeners[hostListener])
	}
	// A single broker cannot hold the default three replicas of the
	// internal topics.
	for _, k := range []string{"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"} {
		if env[k] != "1" {
			p.add("%s = %q, want 1 on a single node", k, env[k])
		}
	}
	return p
}

// checkREADMEValues: the DATABASE_URL and KAFKA_BROKERS the file's header
// gives (as the README does) match its services: postgres's user and
// password, kafka on localhost:9092.
func checkREADMEValues(c compose, text string) problems {
	var p problems
	pg := c.Services["postgres"]
	user := pg.Environment["POSTGRES_USER"]
	if user == "" {
		user = "postgres" // the image's default
	}
	want := fmt.Sprintf("postgres://%s:%s@localhost:5432/", user, pg.Environment["POSTGRES_PASSWORD"])
	if !strings.Contains(text, want) {
		p.add("the file does not mention a DATABASE_URL %s... matching its postgres service", want)
	}
	if !strings.Contains(text, "KAFKA_BROKERS=localhost:9092") {
		p.add("the file does not mention KAFKA_BROKERS=localhost:9092")
	}
	return p
}

// TestComposeFile checks docker-compose.kafka.yml.
func TestComposeFile(t *testing.T) {
	c, text := load(t)
	for _, check := range []struct {
		name string
		p    problems
	}{
		{"services, images and ports", checkServices(c)},
		{"healthchecks", checkHealthchecks(c)},
		{"KRaft single node", checkKRaft(c)},
		{"values in the header comment", checkREADMEValues(c, text)},
	} {
		t.Run(check.name, func(t *testing.T) {
			for _, msg := range check.p {
				t.Errorf("%s: %s", composeFile, msg)
			}
		})
	}
}

// TestComposeChecksCatchMistakes: each check finds a mistake made in a
// copy of the file, so that TestComposeFile passing means something.
func TestComposeChecksCatchMistakes(t *testing.T) {
	_, text := load(t)
	tests := []struct {
		name, old, new string
		want           string // in one of the problems
	}{
		{"service renamed", "\n  postgres:\n", "\n  db:\n", `no service postgres`},
		{"kafka port moved", `"127.0.0.1:9092:9092"`, `"127.0.0.1:9094:9092"`, "published on host port 9094"},
		{"postgres bound to a non-loopback address", `"127.0.0.1:5432:5432"`, `"10.0.0.5:5432:5432"`, "bound to 10.0.0.5"},
		{"other kafka image", "image: apache/kafka:", "image: bitnami/kafka:", "want apache/kafka:"},
		{"postgres 15", "image: postgres:16", "image: postgres:15", "want postgres:16"},
		{"broker only", "KAFKA_PROCESS_ROLES: broker,controller", "KAFKA_PROCESS_ROLES: broker", "want broker,controller"},
		{"no healthcheck", "      test: [\"CMD-SHELL\", \"pg_isready", "      disable: true\n      x: [\"CMD-SHELL\", \"pg_isready", "postgres has no healthcheck"},
		{"advertised elsewhere", "PLAINTEXT://localhost:9092,", "PLAINTEXT://kafka:9092,", "nothing advertises localhost:9092"},
		{"listener without protocol", "PLAINTEXT:PLAINTEXT,INTERNAL", "INTERNAL", "PLAINTEXT has no entry"},
		{"password changed", "POSTGRES_PASSWORD: postgres", "POSTGRES_PASSWORD: secret", "postgres://postgres:secret@localhost:5432/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(text, tt.old) {
				t.Fatalf("the file no longer contains %q; update this case", tt.old)
			}
			mutated := strings.Replace(text, tt.old, tt.new, 1)
			c, err := parse(mutated)
			if err != nil {
				t.Fatalf("mutated file does not parse: %v", err)
			}
			var all problems
			all = append(all, checkServices(c)...)
			all = append(all, checkHealthchecks(c)...)
			all = append(all, checkKRaft(c)...)
			all = append(all, checkREADMEValues(c, mutated)...)
			for _, msg := range all {
				if strings.Contains(msg, tt.want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; problems: %q", tt.want, all)
		})
	}
}
