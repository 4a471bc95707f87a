# Makefile of the Causet projection worker. `make help` lists the targets.

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# Broker of the real-Kafka suite (make kafka-up starts it there).
TEST_KAFKA_BROKERS ?= 127.0.0.1:19092
# make kafka-up's SASL_SSL listener (SCRAM-SHA-512 over TLS) and its private CA.
TEST_KAFKA_SASL_BROKERS ?= 127.0.0.1:19094
TEST_KAFKA_TLS_CA ?= $(CURDIR)/.kafka/tls/ca.pem
# Events in the throughput benchmark (make bench N=1000000).
N ?= 200000
# Events of the unmigrated-tenant scenario of make bench (non-blocking retries).
N_TENANT ?= 1000000
# Events of make bench's second table: the poison kinds that are retried
# (23502, 23514, 23514fn) against clean again, on a stream long enough that their
# first dead letters' retries (~3-9 s with the default policy, before the
# breaker opens) are not most of the run (N_RETRIED=0 skips it).
N_RETRIED ?= 1000000
# Rounds of make bench's alternated runs (medians and spread over them), and
# the scenarios of its table (make bench SCENARIOS=raw,clean; README).
ROUNDS ?= 3
SCENARIOS ?= all
# Fault phase of make soak (make soak SOAK_DURATION=30m); SOAK_SEED,
# SOAK_FAULTS and the rest are read from the environment (README).
SOAK_DURATION ?= 10m
# The short soak that make test runs, with a fixed seed so that CI runs
# the same schedule of faults each time (make soak explores new seeds).
TEST_SOAK_DURATION ?= 75s
TEST_SOAK_SEED ?= 4111227974322730

.PHONY: help build run test test-unit test-kafka test-otel vet fuzz bench bench-peer bench-peer-clean bench-replay soak soak-kafka soak-kafka-clean clean image image-bin check-alerts

help:
	@echo "make run          the worker on an embedded Kafka (127.0.0.1:9092) and a throwaway PostgreSQL, with example events"
	@echo "make test         every test: vet, unit and integration (in-process Kafka, real PostgreSQL)"
	@echo "make test-kafka   the integration suite against the real broker of 'make kafka-up' ($(TEST_KAFKA_BROKERS))"
	@echo "make test-otel    the OTLP tests behind a real OpenTelemetry Collector, built with ocb into .cache/otelcol (cached)"
	@echo "make soak-kafka   3 worker processes killed and restarted on a real broker of its own, restarted once (SOAK_DURATION=5m SOAK_SEED=n)"
	@echo "make kafka-up     start a local Apache Kafka broker (jars resolved with Maven); make kafka-down stops it"
	@echo "make soak         the fault soak: workers, faults and invariants for SOAK_DURATION=$(SOAK_DURATION) (SOAK_SEED=n reproduces a run)"
	@echo "make bench        worker throughput against the best raw PostgreSQL method, poisoned and traced runs against clean, alternated ROUNDS=$(ROUNDS) times (N=$(N) events, SCENARIOS=$(SCENARIOS)); then 1% of N_TENANT=$(N_TENANT) events for an unmigrated tenant"
	@echo "make bench-peer   the worker against Kafka Connect + Debezium JDBC sink, same rows, on a real broker of its own (N=$(N); needs Java 17 and Maven)"
	@echo "make bench-replay dlq-replayer scan/replay speed over 200k dead letters"
	@echo "make build        binaries in bin/"
	@echo "make image        the container image $(IMAGE) with buildah (BINARIES=prebuilt RUNTIME_IMAGE=scratch: no image pulled)"
	@echo "make check-alerts promtool check rules and test rules on the PrometheusRule's alerts (deploy/kubernetes; needs promtool)"

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

# make run ARGS='--kafka-port 29092 --http-addr 127.0.0.1:18080' changes the
# embedded broker's port and the HTTP address (defaults 9092 and :8080).
# The dev command links kfake and a throwaway PostgreSQL, so it exists only
# in a build with -tags dev, kept apart from make build's bin/projection-worker.
run:
	$(GO) build -trimpath -tags dev -ldflags "$(LDFLAGS)" -o bin/projection-worker-dev ./cmd/projection-worker
	./bin/projection-worker-dev dev $(ARGS)

vet:
	$(GO) vet ./...
	$(GO) vet -tags dev ./cmd/projection-worker
	@# Build output is never committed: a tracked file that .gitignore
	@# ignores (a 22 MB dlq-replayer binary sat in the clone, older than its
	@# source: a new-user trial ran it).
	@if git rev-parse --git-dir >/dev/null 2>&1 && [ -n "$$(git ls-files -ci --exclude-standard)" ]; then \
		echo "vet: tracked files that .gitignore ignores (build output committed? git rm --cached them):"; \
		git ls-files -ci --exclude-standard; exit 1; fi

# The tests build without the PGO profile (cmd/projection-worker/default.pgo):
# it changes no behaviour, and compiling every dependency a second time, with
# the profile and the race detector, took make test from 270 s to 674 s. Binaries, the
# image, make run and the benchmarks keep it.
test vet test-kafka test-otel soak soak-kafka fuzz: export GOFLAGS := $(strip $(GOFLAGS) -pgo=off)

# promtool reads a rules file, not a PrometheusRule: the test writes the
# resource's groups to one (built with kustomize, as deployed) and runs
# promtool check rules and promtool test rules on it.
check-alerts:
	CI=true $(GO) test -count=1 -run '^TestAlertRulesPromtool$$' -v ./deploy/kubernetes

# make test: everything, with the race detector. Integration tests use
# DATABASE_URL or start a throwaway PostgreSQL; with CI=true a missing
# service fails them instead of skipping.
test: vet
	$(GO) test -race -count=1 -timeout 12m ./...
	# The dev command (make run) is built only with -tags dev: its test too.
	$(GO) test -race -count=1 -timeout 5m -tags dev -run 'TestDev' ./cmd/projection-worker
	# The worker scenarios again with COPY off, so that the statement path
	# is tested alone too (the suite above sends every upsert group through
	# COPY, and through statements only when a COPY fails).
	TEST_NO_COPY=1 $(GO) test -count=1 -timeout 5m -run 'TestWorker' ./projection
	# A short fault soak (make soak runs the long one); its seed is printed.
	SOAK_SEED=$(TEST_SOAK_SEED) SOAK_DURATION=$(TEST_SOAK_DURATION) $(GO) test -race -count=1 -timeout 8m -run '^TestSoak$$' -v ./internal/soak

# The fault soak (internal/soak, README "Fault soak"): several workers in one
# consumer group against a 3-broker kfake and the test PostgreSQL behind a
# proxy, a seeded schedule of faults, then the invariants; one table, exit 1
# on any violation.
soak:
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -timeout 0 -run '^TestSoak$$' -v ./internal/soak

# The OTLP tests behind a real OpenTelemetry Collector (issue 13):
# scripts/otelcol.sh builds one with the collector builder (ocb) from the Go
# module proxy (scripts/otelcol-builder.yaml; cached in .cache/otelcol), and
# OTELCOL_BIN puts it between the worker and the tests' OTLP receiver
# (internal/otlptest). The tests run are internal/otlptest's and those of
# cmd/projection-worker that use newOTLPReceiver (scripts/otel-tests.sh). A
# collector that cannot be built skips them, with the reason; with CI=true
# it fails.
test-otel:
	@bin=$$(bash scripts/otelcol.sh) || { \
		if [ "$$CI" = true ]; then echo "make test-otel: the collector could not be built (above); CI=true: failing" >&2; exit 1; fi; \
		echo "make test-otel: skipped: the collector could not be built (above); CI=true makes this a failure"; exit 0; }; \
	tests=$$(bash scripts/otel-tests.sh cmd/projection-worker/*_test.go) || exit 1; \
	echo "make test-otel: OTELCOL_BIN=$$bin, cmd/projection-worker -run '$$tests'"; \
	OTELCOL_BIN=$$bin $(GO) test -race -count=1 -timeout 5m -v ./internal/otlptest || exit 1; \
	OTELCOL_BIN=$$bin $(GO) test -race -count=1 -timeout 10m -v -run "$$tests" ./cmd/projection-worker

# The same integration scenarios against a real Apache Kafka broker. Tests
# that need kfake fault injection are skipped by name with the reason; their
# real-broker counterparts run instead. The broker-restart test runs last,
# alone, since it stops and starts the shared broker (make kafka-up's).
test-kafka:
	KAFKA_BROKERS=$(TEST_KAFKA_BROKERS) KAFKA_SASL_SSL_BROKERS=$(TEST_KAFKA_SASL_BROKERS) KAFKA_SASL_SSL_CA=$(TEST_KAFKA_TLS_CA) $(GO) test -count=1 -timeout 12m ./...
	KAFKA_BROKERS=$(TEST_KAFKA_BROKERS) KAFKA_RESTART_TEST=1 $(GO) test -count=1 -timeout 10m -run 'TestWorkerRealBrokerRestartMidStream' -v ./projection

# The real-broker soak (issue 8): 3 `projection-worker run` processes (built
# with -race; SOAK_RACE=0 without) on a broker of its own (.kafka-soak,
# 127.0.0.1:29092, never make kafka-up's), SIGKILLed and SIGTERMed and
# restarted on a seeded schedule, the broker restarted once; then the soak's
# invariants and its table. SOAK_DURATION (default 5m), SOAK_SEED, SOAK_RATE
# (events/s, 60), SOAK_DRAIN (3m). Needs PostgreSQL (DATABASE_URL, or a
# throwaway one), Java and Maven as make kafka-up does. The broker is stopped
# afterwards (its data kept in .kafka-soak; make soak-kafka-clean removes it).
SOAK_KAFKA_ENV := KAFKA_DIR=$(CURDIR)/.kafka-soak KAFKA_PORT=29092 KAFKA_CONTROLLER_PORT=29093
soak-kafka:
	SOAK_KAFKA=1 SOAK_DURATION=$${SOAK_DURATION:-5m} $(GO) test -count=1 -timeout 120m -run '^TestSoakKafka$$' -v ./internal/soak; \
	rc=$$?; $(SOAK_KAFKA_ENV) bash scripts/kafka-down.sh; exit $$rc

soak-kafka-clean:
	$(SOAK_KAFKA_ENV) bash scripts/kafka-down.sh --clean

fuzz:
	$(GO) test ./projection -run '^$$' -fuzz FuzzDecodeEvent -fuzztime 60s

bench:
	BENCH_EVENTS=$(N) BENCH_TENANT_EVENTS=$(N_TENANT) BENCH_ROUNDS=$(ROUNDS) BENCH_SCENARIOS=$(SCENARIOS) $(GO) test ./internal/bench -run '^$$' -bench 'BenchmarkWorkerThroughput|BenchmarkUnmigratedTenant|BenchmarkLargeRecords' -benchtime 1x -timeout 180m -v
	$(GO) test ./projection -run '^$$' -bench 'BenchmarkSweep$$' -benchtime 1x -v
	if [ "$(N_RETRIED)" != 0 ]; then BENCH_EVENTS=$(N_RETRIED) BENCH_ROUNDS=$(ROUNDS) BENCH_SCENARIOS=23502,23514,23514fn $(GO) test ./internal/bench -run '^$$' -bench 'BenchmarkWorkerThroughput$$' -benchtime 1x -timeout 180m -v; fi

# The peer benchmark (issue 11 item 4, README "Performance"): the same rows
# into the same PostgreSQL by the worker and by Kafka Connect standalone with
# Debezium's JDBC sink, alternated, on a real broker of its own (.kafka-peer,
# 127.0.0.1:39092, never make kafka-up's), clean and with 1% poison; one table
# and one JSON line (bench-peer-json:). Connect's jars come from Maven into
# .kafka-connect (scripts/kafka-connect-fetch.sh). N events (make bench-peer
# N=1000000), BENCH_PEER_ROUNDS clean runs of each (default 2). The broker is
# stopped afterwards (its data kept; make bench-peer-clean removes it). Not
# part of make test or CI.
PEER_KAFKA_ENV := KAFKA_DIR=$(CURDIR)/.kafka-peer KAFKA_PORT=39092 KAFKA_CONTROLLER_PORT=39093 KAFKA_SASL_PORT=39094
bench-peer:
	bash scripts/kafka-connect-fetch.sh >/dev/null
	$(PEER_KAFKA_ENV) bash scripts/kafka-up.sh >/dev/null
	BENCH_PEER_BROKERS=127.0.0.1:39092 BENCH_EVENTS=$(N) $(GO) test ./internal/bench -run '^$$' -bench '^BenchmarkPeerKafkaConnect$$' -benchtime 1x -timeout 120m -v; \
	rc=$$?; $(PEER_KAFKA_ENV) bash scripts/kafka-down.sh; exit $$rc

bench-peer-clean:
	$(PEER_KAFKA_ENV) bash scripts/kafka-down.sh --clean

bench-replay:
	$(GO) test ./dlq -run '^$$' -bench BenchmarkScan -benchtime 1x -timeout 30m -v

# The container image (Dockerfile), built with buildah: no Docker daemon.
# By default both commands are compiled in $(GO_IMAGE) and put on
# $(RUNTIME_IMAGE); both are pulled. Without a registry:
#   make image BINARIES=prebuilt RUNTIME_IMAGE=scratch
# compiles them here (make image-bin, the same flags) and pulls nothing.
# BUILDAH_FLAGS are buildah's global flags (the tests give --root, --runroot
# and --storage-driver vfs); chroot isolation lets the build stage's RUN steps
# work where buildah cannot start a runtime (containers, CI sandboxes).
IMAGE             ?= localhost/causet-projection-worker:$(VERSION)
BINARIES          ?= build
GO_IMAGE          ?= docker.io/library/golang:1.26-bookworm
RUNTIME_IMAGE     ?= gcr.io/distroless/static-debian12:nonroot
BUILDAH           ?= buildah
BUILDAH_FLAGS     ?=
BUILDAH_BUD_FLAGS ?= --isolation chroot

image-bin:
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/image/ ./cmd/projection-worker ./cmd/dlq-replayer

image: $(if $(filter prebuilt,$(BINARIES)),image-bin)
	$(BUILDAH) $(BUILDAH_FLAGS) bud $(BUILDAH_BUD_FLAGS) \
		--build-arg BINARIES=$(BINARIES) --build-arg GO_IMAGE=$(GO_IMAGE) \
		--build-arg RUNTIME_IMAGE=$(RUNTIME_IMAGE) --build-arg VERSION=$(VERSION) \
		-t $(IMAGE) .

clean:
	rm -rf bin

include scripts/kafka.mk
