#!/usr/bin/env bash
# pg-up.sh starts a throwaway PostgreSQL server for the tests and prints, on stdout,
# the line that points them at it:
#
#   eval "$(scripts/pg-up.sh)"
#   # export DATABASE_URL='postgres://postgres:postgres@127.0.0.1:55432/postgres?sslmode=disable'
#
# The server listens on 127.0.0.1:$PG_PORT only (default 55432), trusts local
# connections (the password in the URL is set but not checked), runs with fsync=off
# and max_connections=200, and keeps its data in $PG_DATA_DIR (default
# /tmp/causet-projection-worker-pg-$PG_PORT), its log in server.log there. Data is
# not worth keeping: a crash may lose it, and pg-down.sh --clean removes it.
#
# Run as root, initdb and the server run as the 'postgres' OS user (initdb refuses
# root); as another user they run as that user. Binaries are taken from PATH or from
# the newest /usr/lib/postgresql/*/bin (Debian's packages; scripts/install-deps.sh).
#
# It is idempotent: when the server is already running it only prints the line. When
# another PostgreSQL already holds the port and accepts the URL, it is reused (with a
# note on stderr); when the port is held by something else, it fails.
set -euo pipefail

PG_PORT=${PG_PORT:-55432}
PG_DATA_DIR=${PG_DATA_DIR:-/tmp/causet-projection-worker-pg-$PG_PORT}
url="postgres://postgres:postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"

log() { printf 'pg-up: %s\n' "$*" >&2; }
die() {
	log "$*"
	exit 1
}
print_url() { printf "export DATABASE_URL='%s'\n" "$url"; }

# Find initdb, pg_ctl and postgres in one directory.
bindir=
if p=$(command -v pg_ctl) && command -v initdb >/dev/null; then
	bindir=$(dirname "$(readlink -f "$p")")
fi
if [[ -z $bindir || ! -x $bindir/initdb ]]; then
	bindir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
fi
[[ -n $bindir && -x $bindir/pg_ctl && -x $bindir/initdb ]] ||
	die "PostgreSQL server binaries not found on PATH or in /usr/lib/postgresql/*/bin; run scripts/install-deps.sh"

# as_owner runs a command as the user that owns the server.
if [[ $(id -u) -eq 0 ]]; then
	id postgres >/dev/null 2>&1 || die "running as root needs the 'postgres' OS user (Debian's postgresql package creates it)"
	owner=postgres
	as_owner() { runuser -u postgres -- "$@"; }
else
	owner=$(id -un)
	as_owner() { "$@"; }
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# accepts_url reports whether a server answers a query at $url.
accepts_url() {
	if command -v psql >/dev/null; then
		psql "$url" -XAtqc 'select 1' >/dev/null 2>&1
	else
		"$bindir/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres
	fi
}

if [[ -f $PG_DATA_DIR/PG_VERSION ]] && as_owner "$bindir/pg_ctl" -D "$PG_DATA_DIR" status >/dev/null 2>&1; then
	accepts_url || die "the server in $PG_DATA_DIR runs but does not answer at 127.0.0.1:$PG_PORT; see $PG_DATA_DIR/server.log"
	log "already running ($PG_DATA_DIR)"
	print_url
	exit 0
fi
if port_open "$PG_PORT"; then
	if accepts_url; then
		log "reusing the PostgreSQL server already listening on 127.0.0.1:$PG_PORT (not started by this script)"
		print_url
		exit 0
	fi
	die "127.0.0.1:$PG_PORT is taken by something that does not accept $url; set PG_PORT"
fi

if [[ ! -f $PG_DATA_DIR/PG_VERSION ]]; then
	log "initdb $PG_DATA_DIR ($("$bindir/postgres" --version))"
	rm -rf "$PG_DATA_DIR"
	mkdir -p "$PG_DATA_DIR"
	chown "$owner" "$PG_DATA_DIR"
	chmod 700 "$PG_DATA_DIR"
	pwfile=$(mktemp)
	echo postgres >"$pwfile"
	chown "$owner" "$pwfile"
	as_owner "$bindir/initdb" -D "$PG_DATA_DIR" -U postgres --pwfile="$pwfile" \
		--auth=trust --encoding=UTF8 --no-locale >"$PG_DATA_DIR.initdb.log" 2>&1 || {
		rm -f "$pwfile"
		cat "$PG_DATA_DIR.initdb.log" >&2
		die "initdb failed"
	}
	rm -f "$pwfile" "$PG_DATA_DIR.initdb.log"
	echo "include_if_exists = 'test.conf'" | as_owner tee -a "$PG_DATA_DIR/postgresql.conf" >/dev/null
fi

# Settings for tests, rewritten on each start so that changes here apply.
as_owner tee "$PG_DATA_DIR/test.conf" >/dev/null <<CONF
# Written by scripts/pg-up.sh on each start; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DATA_DIR'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
log_min_error_statement = panic
CONF

log "starting PostgreSQL on 127.0.0.1:$PG_PORT ($PG_DATA_DIR)"
as_owner "$bindir/pg_ctl" -D "$PG_DATA_DIR" -l "$PG_DATA_DIR/server.log" -w -t 60 start >/dev/null || {
	tail -n 30 "$PG_DATA_DIR/server.log" >&2 || true
	die "PostgreSQL did not start"
}
accepts_url || die "PostgreSQL started but does not answer at $url; see $PG_DATA_DIR/server.log"
log "ready"
print_url
