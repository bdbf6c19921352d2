#!/usr/bin/env bash
# test-deps.sh — provide what the tests need from the machine; `make test`,
# `make test-short` and .ci/run (through make test) all start here.
#
#   scripts/test-deps.sh          for the full tier
#   scripts/test-deps.sh short    for the short tier: no browser needed
#
# What the tests need, and where it comes from:
#   PostgreSQL   at DATABASE_URL: scripts/ensure-postgres.sh (the machine's
#                cluster, else compose's db, else it says what to do)
#   NATS         the tests embed a JetStream server (the server's own Go
#                library) when none answers at 127.0.0.1:4222; the full tier
#                needs the nats-server binary too, for what it kills: the
#                three-node cluster test and the chaos soak
#   Kafka        nothing: the tests embed a broker (franz-go's kfake)
#   Redis        the redis-server binary: the Redis lab starts a private one
#                when nothing answers at REDIS_URL, and restarts one anyway
#   Chromium     /usr/bin/chromium (CHROMIUM overrides) for the browser tests
#   PgBouncer    /usr/sbin/pgbouncer: the transaction-pooling tests start
#                their own on a private port
# Missing binaries are installed with apt-get when this runs as root on
# Debian; otherwise it says which command installs them and exits 1.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tier="${1:-full}"
say() { echo "test-deps: $*"; }

"$root/scripts/ensure-postgres.sh"

# need BINARY PACKAGE: the binary on PATH (or at its absolute path), else
# the Debian package installed (as root), else a clear message.
missing=()
need() {
	local bin="$1" pkg="$2"
	if command -v "$bin" >/dev/null 2>&1 || [ -x "$bin" ]; then
		return
	fi
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		say "installing $pkg (for $bin)"
		if [ -z "${apt_updated:-}" ]; then
			apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
			apt_updated=1
		fi
		# Another install (a second suite, the machine's own) holds dpkg's
		# lock for a while: wait for it rather than fail.
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$pkg" >/dev/null
		return
	fi
	missing+=("$pkg")
}

need redis-server redis-server
if [ "$tier" != short ]; then
	need "${CHROMIUM:-/usr/bin/chromium}" chromium
	need /usr/sbin/nats-server nats-server
	if [ ! -x /usr/sbin/pgbouncer ]; then
		need /usr/sbin/pgbouncer pgbouncer
		# Debian starts a system pgbouncer on 6432; the tests start their own.
		(command -v systemctl >/dev/null 2>&1 && systemctl stop pgbouncer) >/dev/null 2>&1 || true
	fi
fi
if [ ${#missing[@]} -gt 0 ]; then
	say "missing: ${missing[*]}. Install them (Debian: sudo apt-get install ${missing[*]}) and run again." >&2
	exit 1
fi
say "PostgreSQL answers; redis-server$([ "$tier" != short ] && echo ", Chromium, nats-server and pgbouncer") present; NATS and Kafka are embedded in the tests when none answers"
