#!/usr/bin/env bash
# vulncheck.sh — govulncheck over the whole module (make lint runs it).
#
# govulncheck needs the Go vulnerability database: the public one by
# default, or a copy named by VULNDB (a URL, or file:///path to a mirror in
# the database's own format). When the database cannot be reached this
# script says so in words and does not pretend the code was checked: it
# exits 0 (lint goes on) unless VULNCHECK_REQUIRED=1, when it fails.
set -uo pipefail

db="${VULNDB:-https://vuln.go.dev}"
out="$(go tool govulncheck -db "$db" ./... 2>&1)"
rc=$?
if [ $rc -eq 0 ]; then
	echo "govulncheck: no known vulnerability reaches idemlab's code (database $db)"
	exit 0
fi
if grep -q "fetching vulnerabilities" <<<"$out"; then
	echo "govulncheck: CANNOT REACH the vulnerability database at $db — dependencies were NOT checked." >&2
	echo "  $(grep -m1 "fetching vulnerabilities" <<<"$out")" >&2
	echo "  Run where it is reachable, or set VULNDB=file:///path/to/a/copy (SECURITY.md)." >&2
	[ "${VULNCHECK_REQUIRED:-0}" = 1 ] && exit 1
	exit 0
fi
echo "$out"
echo "govulncheck: known vulnerabilities reach idemlab's code (above): upgrade the modules it names" >&2
exit $rc
