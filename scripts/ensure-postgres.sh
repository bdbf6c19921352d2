#!/usr/bin/env bash
# ensure-postgres.sh — make sure PostgreSQL answers at $DATABASE_URL.
#
# 1. If it already answers, do nothing.
# 2. Otherwise, if Debian's cluster is installed but stopped (a fresh CI
#    machine), start it: pg_ctlcluster <newest version> main start.
# 3. Otherwise, if a Docker engine is reachable, start the compose `db`
#    service and wait for its healthcheck.
# 4. Otherwise, explain what to do and exit 1.
#
# The probe is `pg_isready` when installed, else a TCP connect to the host and
# port parsed from the URL (bash's /dev/tcp), so a bare machine with only Go
# and Docker still works.
set -euo pipefail

DATABASE_URL="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# host_port prints "host port" from a postgres:// URL or a key=value DSN.
host_port() {
	local url="$1" host="" port=""
	case "$url" in
	postgres://* | postgresql://*)
		local rest="${url#*://}"
		rest="${rest%%[/?]*}" # authority: [user[:pass]@]host[:port]
		rest="${rest##*@}"
		rest="${rest%%,*}" # first host of a multi-host URL
		if [[ "$rest" == \[* ]]; then # [ipv6]:port
			host="${rest%%]*}"
			host="${host#[}"
			[[ "$rest" == *]:* ]] && port="${rest##*]:}"
		elif [[ "$rest" == *:* ]]; then
			host="${rest%%:*}"
			port="${rest##*:}"
		else
			host="$rest"
		fi
		;;
	*)
		local word
		for word in $url; do
			case "$word" in
			host=*) host="${word#host=}" ;;
			port=*) port="${word#port=}" ;;
			esac
		done
		;;
	esac
	echo "${host:-127.0.0.1} ${port:-5432}"
}

answers() {
	if command -v pg_isready >/dev/null 2>&1; then
		pg_isready -q -t 3 -d "$DATABASE_URL"
		return
	fi
	local host port
	read -r host port < <(host_port "$DATABASE_URL")
	timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null
}

where="$(host_port "$DATABASE_URL")"
where="${where/ /:}"

if answers; then
	echo "ensure-postgres: PostgreSQL answers at $where"
	exit 0
fi

if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ] && [ -n "$(ls /etc/postgresql)" ]; then
	version="$(ls /etc/postgresql | sort -V | tail -n 1)"
	echo "ensure-postgres: nothing answers at $where; starting Debian's PostgreSQL $version cluster"
	pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
	for _ in $(seq 1 60); do
		if answers; then
			echo "ensure-postgres: PostgreSQL answers at $where"
			exit 0
		fi
		sleep 1
	done
fi

if command -v docker >/dev/null 2>&1 && timeout 15 docker info >/dev/null 2>&1; then
	echo "ensure-postgres: nothing answers at $where; starting the compose db service"
	docker compose -f "$root/docker-compose.yml" up -d --wait db db-standby # the primary waits for its synchronous standby
	for _ in $(seq 1 30); do
		if answers; then
			echo "ensure-postgres: PostgreSQL answers at $where"
			exit 0
		fi
		sleep 1
	done
fi

cat >&2 <<EOF
ensure-postgres: PostgreSQL does not answer at $where.
  DATABASE_URL=$DATABASE_URL
Start one of:
  - a local PostgreSQL 15+ reachable at that URL, or
  - the compose database: docker compose up -d --wait db db-standby (needs a running Docker engine)
or point DATABASE_URL at a server the tests may create databases in.
EOF
exit 1
