#!/usr/bin/env bash
# devdb.sh — a PostgreSQL for `make run`, on a machine with Debian's
# PostgreSQL packages but no running server.
#
#   scripts/devdb.sh          print a DATABASE_URL that answers: $DATABASE_URL
#                             when it does, else a private cluster's in tmp/pg
#                             (made with initdb the first time, then started)
#   scripts/devdb.sh stop     stop the private cluster (its data stays in tmp/pg)
#
# The private cluster listens on 127.0.0.1:$DEVDB_PORT (default 55432) with
# trust authentication, its socket and log in tmp/pg: a folder of this
# project, ignored by git, removed by nothing but you. PostgreSQL refuses to
# run as root, so under root the server runs as the `postgres` user, who
# then owns tmp/pg. Only the URL goes to stdout; what it does goes to stderr.
set -euo pipefail

DATABASE_URL="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/tmp/pg"
port="${DEVDB_PORT:-55432}"
private="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"

say() { echo "devdb: $*" >&2; }

bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"

# as_owner runs a server binary as the cluster's owner: this user, or
# postgres when this is root.
as_owner() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

if [ "${1:-}" = stop ]; then
	if [ -f "$dir/data/postmaster.pid" ]; then
		as_owner "$bindir/pg_ctl" -D "$dir/data" stop -m fast >&2
	else
		say "no private cluster running in $dir"
	fi
	exit 0
fi

if pg_isready -q -t 3 -d "$DATABASE_URL" 2>/dev/null; then
	echo "$DATABASE_URL"
	exit 0
fi
if pg_isready -q -t 1 -d "$private" 2>/dev/null; then
	say "using the private cluster in $dir (port $port)"
	echo "$private"
	exit 0
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
	say "nothing answers at DATABASE_URL and there are no server binaries in /usr/lib/postgresql/<version>/bin"
	say "install them (apt-get install postgresql), start docker compose's db, or set DATABASE_URL"
	exit 1
fi

mkdir -p "$dir"
if [ "$(id -u)" = 0 ]; then
	chown postgres: "$dir"
fi
if [ ! -f "$dir/data/PG_VERSION" ]; then
	say "nothing answers at DATABASE_URL: making a private cluster in $dir ($bindir)"
	as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1 ||
		{ say "initdb failed:"; cat "$dir/initdb.log" >&2; exit 1; }
fi
say "starting the private cluster on 127.0.0.1:$port (log: $dir/server.log; stop it with scripts/devdb.sh stop)"
as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
	-o "-c listen_addresses=127.0.0.1 -p $port -k $dir" start >&2 ||
	{ say "the server did not start:"; tail -n 20 "$dir/server.log" >&2; exit 1; }
echo "$private"
