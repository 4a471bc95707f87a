#!/usr/bin/env bash
# kafka-down.sh stops the test broker started by kafka-up.sh: SIGTERM (a controlled
# shutdown that flushes the logs), then SIGKILL after KAFKA_STOP_TIMEOUT seconds
# (default 30). The data folder is kept, so a later kafka-up.sh resumes with the same
# topics, records and committed offsets. Stopping a broker that is not running is not
# an error.
#
#   kafka-down.sh           stop, keep .kafka/data
#   kafka-down.sh --clean   stop, then remove the data, the logs and the generated
#                           configuration (the cached jars in .kafka/lib stay)
#
# Environment: KAFKA_DIR (default <repo>/.kafka), KAFKA_STOP_TIMEOUT.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/.." && pwd)

KAFKA_DIR=${KAFKA_DIR:-$repo_root/.kafka}
KAFKA_STOP_TIMEOUT=${KAFKA_STOP_TIMEOUT:-30}
config=$KAFKA_DIR/server.properties
pid_file=$KAFKA_DIR/broker.pid

clean=false
case ${1:-} in
'') ;;
--clean) clean=true ;;
*)
	echo "usage: $0 [--clean]" >&2
	exit 2
	;;
esac

log() { printf 'kafka-down: %s\n' "$*" >&2; }

if [[ ! -d $KAFKA_DIR ]]; then
	log "nothing to stop ($KAFKA_DIR does not exist)"
	exit 0
fi
exec 9>"$KAFKA_DIR/.lock"
flock -w 180 9 || {
	log "another kafka-up/kafka-down holds $KAFKA_DIR/.lock"
	exit 1
}

# broker_pid prints the recorded PID when that process is still this folder's broker.
broker_pid() {
	local pid
	[[ -f $pid_file ]] || return 1
	pid=$(<"$pid_file")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "kafka.Kafka $config" || return 1
	echo "$pid"
}

if pid=$(broker_pid); then
	log "stopping the broker (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	deadline=$((SECONDS + KAFKA_STOP_TIMEOUT))
	while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
		sleep 0.2
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "still running after ${KAFKA_STOP_TIMEOUT}s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	fi
	log "stopped"
else
	log "not running"
fi
rm -f "$pid_file"

if $clean; then
	rm -rf "$KAFKA_DIR/data" "$KAFKA_DIR"/broker.log* "$KAFKA_DIR"/tools.log* \
		"$KAFKA_DIR/broker.out" "$KAFKA_DIR/format.out" "$KAFKA_DIR/ready-check.err" \
		"$KAFKA_DIR/maven.log" \
		"$config"
	log "removed the data and logs in $KAFKA_DIR (jars kept in $KAFKA_DIR/lib)"
fi
