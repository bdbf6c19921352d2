#!/usr/bin/env bash
# connpeak.sh — the most client connections PostgreSQL held at once while a
# command ran (the suite's budget is 60: docs/testing.md).
#
#   scripts/connpeak.sh make test
#
# Polls pg_stat_activity every 200 ms over one session of its own (not
# counted) and prints the peak, and the databases holding it, when the
# command ends; exits with the command's status. It counts every client of
# the server at DATABASE_URL: measure on a server nobody else uses.
set -uo pipefail

DATABASE_URL="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable}"
log="$(mktemp)"

# One row per sample: the count, then the count per database.
query="SELECT coalesce(sum(n), 0) || ' ' || coalesce(string_agg(datname || '=' || n, ',' ORDER BY n DESC), '')
FROM (SELECT datname, count(*) AS n FROM pg_stat_activity
      WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
      GROUP BY datname) per_db"
{ echo "$query"; echo '\watch 0.2'; } | psql -X -At -d "$DATABASE_URL" >"$log" 2>/dev/null &
sampler=$!

"$@"
status=$?

kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
peak="$(awk '$1 > max { max = $1; line = $2 } END { print max + 0, line }' "$log")"
echo "connpeak: peak ${peak%% *} client connections (samples: $(wc -l <"$log"); busiest: ${peak#* })"
rm -f "$log"
exit "$status"
