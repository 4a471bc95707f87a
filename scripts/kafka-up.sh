#!/usr/bin/env bash
# kafka-up.sh starts a single-node Apache Kafka 4 broker for tests: KRaft, one process
# that is both broker and controller, on 127.0.0.1 only.
#
#   bootstrap server   127.0.0.1:${KAFKA_PORT:-19092}   (PLAINTEXT)
#   SASL_SSL listener  127.0.0.1:${KAFKA_SASL_PORT:-KAFKA_PORT+2}   (SCRAM-SHA-512 over TLS;
#                      users are created through the Admin API on the PLAINTEXT listener;
#                      the server certificate, for 127.0.0.1 and localhost, is signed by a
#                      private CA: tls/ca.pem)
#   controller         127.0.0.1:${KAFKA_CONTROLLER_PORT:-19093}
#   state              ${KAFKA_DIR:-<repo>/.kafka}: lib/ (jars), data/ (log dirs), tls/,
#                      server.properties, broker.pid, broker.log, broker.out
#
# The jars come from Maven with scripts/kafka/pom.xml and are cached in .kafka/lib
# (resolved again only when the pom changes). The data folder is formatted once and
# kept: kafka-down.sh stops the broker and a later kafka-up.sh resumes with the same
# topics and offsets. Running it while the broker is up only checks that it answers.
#
# It returns once the broker answers a metadata request (kcat -L, or Kafka's
# TopicCommand --list where kcat is missing) and prints KAFKA_BROKERS=<host:port>,
# KAFKA_SASL_SSL_BROKERS=<host:port> and KAFKA_SASL_SSL_CA=<path> on stdout, or fails with the tail of the broker's log after KAFKA_START_TIMEOUT seconds
# (default 60; at once when the broker exits).
#
# Environment: KAFKA_DIR, KAFKA_PORT, KAFKA_SASL_PORT, KAFKA_CONTROLLER_PORT, KAFKA_START_TIMEOUT,
# KAFKA_HEAP_OPTS (default "-Xms256m -Xmx768m"), JAVA_HOME, MVN (default mvn).
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/.." && pwd)

KAFKA_DIR=${KAFKA_DIR:-$repo_root/.kafka}
KAFKA_PORT=${KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-19093}
KAFKA_SASL_PORT=${KAFKA_SASL_PORT:-$((KAFKA_PORT + 2))}
KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-60}
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}
MVN=${MVN:-mvn}

pom=$script_dir/kafka/pom.xml
log4j_config=$script_dir/kafka/log4j2.properties
lib=$KAFKA_DIR/lib
data=$KAFKA_DIR/data
config=$KAFKA_DIR/server.properties
pid_file=$KAFKA_DIR/broker.pid
tls=$KAFKA_DIR/tls
tls_pass=causet-test-only
bootstrap=127.0.0.1:$KAFKA_PORT

log() { printf 'kafka-up: %s\n' "$*" >&2; }
print_env() {
	echo "KAFKA_BROKERS=$bootstrap"
	echo "KAFKA_SASL_SSL_BROKERS=127.0.0.1:$KAFKA_SASL_PORT"
	echo "KAFKA_SASL_SSL_CA=$tls/ca.pem"
}
die() { log "$*"; exit 1; }

if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
	java=$JAVA_HOME/bin/java
else
	java=$(command -v java) || die "java not found: Kafka 4 needs Java 17 or newer"
fi

mkdir -p "$KAFKA_DIR"
# One kafka-up/kafka-down at a time on this folder.
exec 9>"$KAFKA_DIR/.lock"
flock -w 180 9 || die "another kafka-up/kafka-down holds $KAFKA_DIR/.lock"

# broker_pid prints the PID of the broker recorded in broker.pid when that process is
# still this folder's broker (a PID reused by another process does not count).
broker_pid() {
	local pid
	[[ -f $pid_file ]] || return 1
	pid=$(<"$pid_file")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "kafka.Kafka $config" || return 1
	echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# tool runs a Kafka command-line class with a small heap; its log goes to
# .kafka/tools.log so it does not interleave with the broker's.
tool=("$java" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
	-Dlog4j2.configurationFile="$log4j_config"
	-Dkafka.logs.dir="$KAFKA_DIR" -Dkafka.log.file=tools.log -Dkafka.log.level=WARN
	-cp "$lib/*")

# answers_metadata asks the broker for its metadata, within $1 seconds: with kcat when
# it is installed (instant), else with Kafka's TopicCommand (a JVM start, 1-3 s).
answers_metadata() {
	if command -v kcat >/dev/null; then
		timeout "$1" kcat -b "$bootstrap" -L -m 5 >/dev/null 2>"$KAFKA_DIR/ready-check.err"
	else
		timeout "$1" "${tool[@]}" org.apache.kafka.tools.TopicCommand \
			--bootstrap-server "$bootstrap" --list >/dev/null 2>"$KAFKA_DIR/ready-check.err"
	fi
}

fail_with_log() {
	log "$1"
	for f in "$KAFKA_DIR/broker.out" "$KAFKA_DIR/broker.log"; do
		[[ -s $f ]] || continue
		log "--- last lines of $f ---"
		tail -n 40 "$f" | cut -c1-400 >&2
	done
	exit 1
}

# wait_ready waits until the broker lists topics or the deadline passes.
wait_ready() {
	local pid=$1 deadline=$((SECONDS + KAFKA_START_TIMEOUT)) left
	until port_open "$KAFKA_PORT"; do
		kill -0 "$pid" 2>/dev/null || fail_with_log "broker (pid $pid) exited during start"
		((SECONDS < deadline)) || fail_with_log "broker did not open $bootstrap within ${KAFKA_START_TIMEOUT}s"
		sleep 0.2
	done
	while :; do
		left=$((deadline - SECONDS))
		((left > 0)) || fail_with_log "broker did not answer metadata on $bootstrap within ${KAFKA_START_TIMEOUT}s"
		if answers_metadata "$left"; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || fail_with_log "broker (pid $pid) exited during start"
		sleep 0.5
	done
}

if pid=$(broker_pid); then
	wait_ready "$pid"
	log "already running (pid $pid) on $bootstrap"
	print_env
	exit 0
fi
rm -f "$pid_file"
if port_open "$KAFKA_PORT" || port_open "$KAFKA_CONTROLLER_PORT"; then
	die "port $KAFKA_PORT or $KAFKA_CONTROLLER_PORT on 127.0.0.1 is taken by a process that is not this folder's broker"
fi

# Resolve the jars once per version of the pom.
pom_sum=$(sha256sum "$pom" | cut -d' ' -f1)
if [[ ! -f $lib/.pom.sha256 || $(<"$lib/.pom.sha256") != "$pom_sum" ]]; then
	command -v "$MVN" >/dev/null || die "$MVN not found: it is needed once to fetch the Kafka jars"
	log "resolving the Kafka jars with Maven into $lib"
	start=$SECONDS
	tmp_lib=$KAFKA_DIR/lib.tmp
	rm -rf "$tmp_lib"
	"$MVN" -B -q -f "$pom" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp_lib" >"$KAFKA_DIR/maven.log" 2>&1 || {
		cat "$KAFKA_DIR/maven.log" >&2
		die "Maven could not resolve the Kafka jars (see above)"
	}
	echo "$pom_sum" >"$tmp_lib/.pom.sha256"
	rm -rf "$lib"
	mv "$tmp_lib" "$lib"
	log "resolved $(find "$lib" -name '*.jar' | wc -l) jars in $((SECONDS - start))s"
fi

# The SASL_SSL listener's key and certificate, signed by a private CA, made once with
# the JDK's keytool (PKCS12 files; the password only protects test keys).
if [[ ! -f $tls/server.p12 || ! -f $tls/ca.pem ]]; then
	keytool=$(dirname "$(readlink -f "$java")")/keytool
	[[ -x $keytool ]] || die "keytool not found next to $java: the SASL_SSL listener needs it"
	rm -rf "$tls" && mkdir -p "$tls"
	kt() { "$keytool" "$@" -storepass "$tls_pass" -storetype PKCS12 >>"$tls/keytool.out" 2>&1; }
	kt -genkeypair -alias ca -keyalg RSA -keysize 2048 -dname "CN=causet test CA" \
		-ext bc:c -validity 3650 -keystore "$tls/ca.p12" ||
		die "keytool: the CA: $(tail -3 "$tls/keytool.out")"
	kt -exportcert -rfc -alias ca -keystore "$tls/ca.p12" -file "$tls/ca.pem"
	kt -genkeypair -alias server -keyalg RSA -keysize 2048 -dname "CN=localhost" \
		-validity 3650 -keystore "$tls/server.p12"
	kt -certreq -alias server -keystore "$tls/server.p12" -file "$tls/server.csr"
	kt -gencert -alias ca -keystore "$tls/ca.p12" -infile "$tls/server.csr" \
		-outfile "$tls/server.pem" -rfc -ext SAN=dns:localhost,ip:127.0.0.1 -validity 3650
	kt -importcert -noprompt -alias ca -keystore "$tls/server.p12" -file "$tls/ca.pem"
	kt -importcert -alias server -keystore "$tls/server.p12" -file "$tls/server.pem" ||
		die "keytool: the server certificate: $(tail -3 "$tls/keytool.out")"
	log "made a private CA and the SASL_SSL listener's certificate in $tls"
fi

# The configuration is written on every start so that changes here apply to an
# existing data folder. The controller endpoint is recorded in the metadata log at
# format time: change KAFKA_CONTROLLER_PORT only together with kafka-clean.
mkdir -p "$data"
cat >"$config" <<PROPS
# Written by scripts/kafka-up.sh on each start; edit the script, not this file.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL

# SASL_SSL: SCRAM-SHA-512 users (created with the Admin API), TLS with tls/server.p12.
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$tls/server.p12
ssl.keystore.password=$tls_pass
ssl.key.password=$tls_pass
log.dirs=$data

# One node: every internal topic has a single replica.
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests join consumer groups often: no wait for more members.
group.initial.rebalance.delay.ms=0
# auto.create.topics.enable stays at its default (true).

# Small files for a test machine; retention stays at the default 7 days.
log.segment.bytes=8388608
log.cleaner.dedupe.buffer.size=16777216
log.retention.check.interval.ms=60000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
PROPS

if [[ ! -f $data/meta.properties ]]; then
	cluster_id=$("${tool[@]}" kafka.tools.StorageTool random-uuid)
	log "formatting $data (cluster id $cluster_id)"
	"${tool[@]}" kafka.tools.StorageTool format --config "$config" \
		--cluster-id "$cluster_id" --standalone >"$KAFKA_DIR/format.out" 2>&1 ||
		{ cat "$KAFKA_DIR/format.out" >&2; die "formatting $data failed"; }
fi

log "starting the broker on $bootstrap"
: >"$KAFKA_DIR/broker.out"
# setsid detaches the broker from the caller's terminal and process group. The inner
# shell writes its own PID ($$, kept by exec) to the PID file. The broker must not
# inherit the lock (fd 9), or it would hold it for as long as it runs.
# shellcheck disable=SC2086,SC2016 # KAFKA_HEAP_OPTS holds several JVM options.
setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pid_file" \
	"$java" $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
	-Djava.awt.headless=true \
	-Dlog4j2.configurationFile="$log4j_config" -Dkafka.logs.dir="$KAFKA_DIR" \
	-cp "$lib/*" kafka.Kafka "$config" \
	</dev/null >>"$KAFKA_DIR/broker.out" 2>&1 9>&- &
for _ in $(seq 100); do [[ -s $pid_file ]] && break; sleep 0.1; done
[[ -s $pid_file ]] || fail_with_log "the broker process did not start"
pid=$(<"$pid_file")
wait_ready "$pid"
log "ready (pid $pid) on $bootstrap"
print_env
