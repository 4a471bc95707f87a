#!/usr/bin/env bash
# kafka-connect-fetch.sh resolves Apache Kafka Connect and Debezium's JDBC sink connector
# for the peer benchmark (make bench-peer) with Maven, from scripts/kafka-connect/pom.xml:
#
#   ${KAFKA_CONNECT_DIR:-<repo>/.kafka-connect}/lib       Connect's jars (ConnectStandalone)
#   ${KAFKA_CONNECT_DIR:-<repo>/.kafka-connect}/plugins   plugin.path: debezium-connector-jdbc/
#
# They are resolved again only when the pom changes; nothing is installed elsewhere.
# On success it prints KAFKA_CONNECT_DIR=<dir> on stdout.
#
# Environment: KAFKA_CONNECT_DIR, MVN (default mvn). Java 17+ runs the result.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/.." && pwd)

KAFKA_CONNECT_DIR=${KAFKA_CONNECT_DIR:-$repo_root/.kafka-connect}
MVN=${MVN:-mvn}
pom=$script_dir/kafka-connect/pom.xml

log() { printf 'kafka-connect-fetch: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

mkdir -p "$KAFKA_CONNECT_DIR"
exec 9>"$KAFKA_CONNECT_DIR/.lock"
flock -w 600 9 || die "another kafka-connect-fetch holds $KAFKA_CONNECT_DIR/.lock"

pom_sum=$(sha256sum "$pom" | cut -d' ' -f1)
stamp=$KAFKA_CONNECT_DIR/.pom.sha256
if [[ ! -f $stamp || $(<"$stamp") != "$pom_sum" ]]; then
	command -v "$MVN" >/dev/null || die "$MVN not found: it is needed once to fetch Kafka Connect"
	log "resolving Kafka Connect and the Debezium JDBC sink with Maven into $KAFKA_CONNECT_DIR"
	start=$SECONDS
	tmp=$KAFKA_CONNECT_DIR/tmp
	rm -rf "$tmp" && mkdir -p "$tmp"
	mvnq() {
		"$MVN" -B -q -f "$pom" "$@" >>"$KAFKA_CONNECT_DIR/maven.log" 2>&1 || {
			tail -n 40 "$KAFKA_CONNECT_DIR/maven.log" >&2
			die "Maven could not resolve Kafka Connect or the Debezium JDBC sink (see above)"
		}
	}
	: >"$KAFKA_CONNECT_DIR/maven.log"
	mvnq dependency:copy-dependencies -DincludeScope=runtime -DexcludeTypes=tar.gz \
		-DoutputDirectory="$tmp/lib"
	# The plugin's "already unpacked" markers go to the temporary folder, not
	# to the pom's target/ in the repository, where a stale one would make it
	# skip the unpacking.
	mvnq dependency:unpack-dependencies -DincludeTypes=tar.gz -DoutputDirectory="$tmp/plugins" \
		-DmarkersDirectory="$tmp/markers"
	rm -rf "$tmp/plugins"/PaxHeaders.* # pax tar headers unpacked as folders
	[[ -d $tmp/plugins/debezium-connector-jdbc ]] ||
		die "the Debezium JDBC sink's plugin archive did not unpack to plugins/debezium-connector-jdbc"
	rm -rf "$KAFKA_CONNECT_DIR/lib" "$KAFKA_CONNECT_DIR/plugins"
	mv "$tmp/lib" "$tmp/plugins" "$KAFKA_CONNECT_DIR/"
	rm -rf "$tmp"
	echo "$pom_sum" >"$stamp"
	log "resolved $(find "$KAFKA_CONNECT_DIR/lib" -name '*.jar' | wc -l) Connect jars and $(find "$KAFKA_CONNECT_DIR/plugins" -name '*.jar' | wc -l) plugin jars in $((SECONDS - start))s"
fi
echo "KAFKA_CONNECT_DIR=$KAFKA_CONNECT_DIR"
