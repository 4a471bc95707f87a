#!/usr/bin/env bash
# pg-down.sh stops the PostgreSQL server started by pg-up.sh (fast shutdown: open
# sessions are ended). Stopping a server that is not running is not an error; a
# server that pg-up.sh only reused is left alone.
#
#   pg-down.sh           stop, keep the data
#   pg-down.sh --clean   stop, then remove the data folder
#
# Environment: PG_PORT (default 55432), PG_DATA_DIR, as for pg-up.sh.
set -euo pipefail

PG_PORT=${PG_PORT:-55432}
PG_DATA_DIR=${PG_DATA_DIR:-/tmp/causet-projection-worker-pg-$PG_PORT}

clean=false
case ${1:-} in
'') ;;
--clean) clean=true ;;
*)
	echo "usage: $0 [--clean]" >&2
	exit 2
	;;
esac

log() { printf 'pg-down: %s\n' "$*" >&2; }

if [[ $(id -u) -eq 0 ]]; then
	as_owner() { runuser -u postgres -- "$@"; }
else
	as_owner() { "$@"; }
fi

bindir=
if p=$(command -v pg_ctl); then
	bindir=$(dirname "$(readlink -f "$p")")
else
	bindir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
fi

if [[ -f $PG_DATA_DIR/PG_VERSION && -n $bindir ]] &&
	as_owner "$bindir/pg_ctl" -D "$PG_DATA_DIR" status >/dev/null 2>&1; then
	as_owner "$bindir/pg_ctl" -D "$PG_DATA_DIR" -m fast -w -t 60 stop >/dev/null
	log "stopped ($PG_DATA_DIR)"
else
	log "not running ($PG_DATA_DIR)"
fi

if $clean; then
	rm -rf "$PG_DATA_DIR"
	log "removed $PG_DATA_DIR"
fi
