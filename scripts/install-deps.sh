#!/usr/bin/env bash
# install-deps.sh installs, on a Debian machine and as root, the system packages that
# the tests and the local dev stack need and that a fresh machine may lack:
#
#   postgresql               server for the database tests (scripts/pg-up.sh)
#   kcat                     to inspect topics, as operators do (SPEC.md §1)
#   jq                       to filter kcat -J output (README "Inspecting the DLQ"; the
#                            kcat interoperability test runs those jq lines)
#   openjdk-17-jre-headless  to run the local Kafka broker (scripts/kafka-up.sh)
#   maven                    to fetch the broker's jars once
#   buildah                  to build the container image without a Docker daemon (make image;
#                            the image test in deploy/kubernetes)
#   prometheus               for promtool: the alerting rules and a scraped /metrics are checked
#                            with it (Debian ships promtool in this package; the server is not
#                            started, policy-rc.d below keeps it down)
#
# It is idempotent: packages already present are left alone, and 'apt-get update' runs
# once, only when something is to be installed. It prints what it did.
set -euo pipefail

log() { printf 'install-deps: %s\n' "$*"; }

if [[ $(id -u) -ne 0 ]]; then
	log "must run as root (it uses apt-get)" >&2
	exit 1
fi
command -v apt-get >/dev/null || {
	log "apt-get not found: this script is for Debian" >&2
	exit 1
}

# postgres_present reports whether a PostgreSQL server (initdb, pg_ctl) is on this
# machine, from Debian's packages or on PATH.
postgres_present() {
	command -v pg_ctl >/dev/null && command -v initdb >/dev/null && return 0
	compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
}

# java_present reports whether java 17 or newer is on PATH.
java_present() {
	local v
	command -v java >/dev/null || return 1
	v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p')
	[[ $v =~ ^[0-9]+$ ]] && ((v >= 17))
}

missing=()

# want_command CMD PACKAGE adds PACKAGE to the list to install unless CMD is on
# PATH.
want_command() {
	if command -v "$1" >/dev/null; then
		log "$1: present"
	else
		missing+=("$2")
	fi
}

if postgres_present && command -v psql >/dev/null; then
	log "postgresql: present"
else
	missing+=(postgresql)
fi
want_command kcat kcat
want_command jq jq
if java_present; then
	log "java 17+: present"
else
	missing+=(openjdk-17-jre-headless)
fi
want_command mvn maven
want_command buildah buildah
want_command promtool prometheus

if ((${#missing[@]} == 0)); then
	log "nothing to install"
	exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log "apt-get update"
apt-get update -qq
log "installing: ${missing[*]}"
# policy-rc.d keeps the package from starting the Debian cluster service: the tests
# start their own server with scripts/pg-up.sh.
policy=/usr/sbin/policy-rc.d
created_policy=false
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod +x "$policy"
	created_policy=true
fi
status=0
apt-get install -y -qq --no-install-recommends "${missing[@]}" || status=$?
if $created_policy; then rm -f "$policy"; fi
if ((status != 0)); then
	log "apt-get install failed (exit $status)" >&2
	exit "$status"
fi
log "installed: ${missing[*]}"
