#!/usr/bin/env bash
# dbwork.sh — what PostgreSQL does per cancellation (OP=book: per booking of
# a free slot): buffers, WAL records, WAL bytes, full-page images, commits,
# statements and the cluster's CPU, from the deltas of pg_stat_database,
# pg_stat_wal and pg_stat_statements over N operations sent over HTTP (CONC
# at once, curl) after a warm-up of WARM, VACUUM ANALYZE and CHECKPOINT
# (docs/performance.md, "Database work per cancellation"), then every
# statement with its calls, buffers and WAL per operation. pg_stat_wal is the whole cluster's: run it on a
# server nothing else uses. The server needs pg_stat_statements in
# shared_preload_libraries; PGDATA (the cluster's data directory, for its
# postmaster's pid) is needed for the CPU column only.
#
#   SERVER=postgres://postgres@127.0.0.1:21001/postgres?sslmode=disable PGDATA=… scripts/bench/dbwork.sh [LABEL]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
label="${1:-dbwork}"
n="${N:-600}"; warm="${WARM:-300}"; conc="${CONC:-4}"; op="${OP:-cancel}"
slots=1; [[ $op == book ]] && slots=$((n + warm + 10)) # a free slot for every booking
srv="${SERVER:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}"
db=idemlab_dbwork; url="${srv/\/postgres\?/\/$db?}"
port="${PORT:-18300}"
app="http://127.0.0.1:$port"
w="$(mktemp -d)"; apid=""
trap '[[ -n "$apid" ]] && kill $apid 2>/dev/null; rm -rf "$w"' EXIT
(cd "$root" && go build -o $w/web ./cmd/web)
psql -q "$srv" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null 2>&1
psql -q "$url" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
DATABASE_URL="$url" $w/web migrate up >/dev/null 2>&1
start() {
  EVENTS_WORKERS=off DATABASE_URL="$url" ADDR=127.0.0.1:$port PROVIDER_ADDR=127.0.0.1:$((port + 1)) PAYMENTS_ADDR=127.0.0.1:$((port + 2)) DEMO_MODE=true RATE_LIMIT_EXEMPT=127.0.0.1 \
    SESSION_SECRET=bench-secret-0123456789abcdef0123 INSTANCE_ID=m LOG_LEVEL=error DB_MAX_CONNS=8 $w/web serve >$w/app.log 2>&1 &
  apid=$!
  for _ in $(seq 200); do curl -fs $app/readyz >/dev/null 2>&1 && return; sleep 0.1; done
  echo "app did not start"; cat $w/app.log; exit 1
}
stop() { kill $apid; wait $apid 2>/dev/null || true; }
start
curl -fsS -X POST $app/api/v1/admin/reset -H 'Authorization: Bearer demo-admin' -H 'Content-Type: application/json' \
  -d "{\"users\": 20, \"policies_per_user\": 100, \"slots\": $slots}" > $w/reset.json
jq -r '.users[] | select(.role=="customer") | "\(.name) \(.token)"' $w/reset.json > $w/tokens
if [[ $op == book ]]; then
  # Free slots, each booked once, by customers in turn.
  psql -qAt "$url" -c "SELECT id FROM slots WHERE status = 'AVAILABLE' ORDER BY random()" |
    awk 'NR==FNR { tok[NR]=$2; t=NR; next } { print $1, tok[(FNR % t) + 1] }' $w/tokens - > $w/work
  done_sql="SELECT count(*) FROM bookings WHERE status = 'CONFIRMED'"
else
  psql -qAtF' ' "$url" -c "SELECT p.id, u.name FROM policies p JOIN users u ON u.id = p.user_id WHERE p.status = 'ACTIVE' ORDER BY random()" > $w/policies
  awk 'NR==FNR { tok[$1]=$2; next } ($2 in tok) { print $1, tok[$2] }' $w/tokens $w/policies > $w/work
  done_sql="SELECT count(*) FROM operations WHERE status = 'SUCCEEDED' AND operation_type = 'CANCEL'"
fi
[[ $(wc -l < $w/work) -ge $((n + warm)) ]] || { echo "not enough policies or slots"; exit 1; }
cancel() { curl -s -o /dev/null -w '%{http_code}\n' -X POST "$app/api/v1/policies/$1/cancel" -H "Authorization: Bearer $2" -H "Idempotency-Key: m-$1" -H 'Content-Type: application/json' -d '{"reason":"measured"}'; }
book() { curl -s -o /dev/null -w '%{http_code}\n' -X POST "$app/api/v1/slots/$1/book" -H "Authorization: Bearer $2" -H "Idempotency-Key: b-$1" -H 'Content-Type: application/json' -d '{}'; }
export -f cancel book; export app
head -n $warm $w/work | xargs -P $conc -L 1 bash -c "$op"' "$@"' _ > $w/warm.codes
psql -q "$url" -c 'VACUUM ANALYZE' -c CHECKPOINT >/dev/null
sleep 1
pm=$(head -1 "${PGDATA:-/nonexistent}/postmaster.pid" 2>/dev/null || echo 0)
cpu() { local s=0; for p in $(pgrep -P $pm 2>/dev/null); do read -r -a f < /proc/$p/stat 2>/dev/null || continue; s=$((s + f[13] + f[14])); done; echo $s; }
snap() { psql -qAtF' ' "$url" -c "SELECT (SELECT blks_hit+blks_read FROM pg_stat_database WHERE datname='$db'), (SELECT xact_commit FROM pg_stat_database WHERE datname='$db'), wal_records, wal_bytes, wal_fpi, (SELECT sum(calls) FROM pg_stat_statements s JOIN pg_database d ON d.oid=s.dbid WHERE d.datname='$db'), (SELECT sum(shared_blks_hit+shared_blks_read) FROM pg_stat_statements s JOIN pg_database d ON d.oid=s.dbid WHERE d.datname='$db'), ($done_sql) FROM pg_stat_wal"; }
psql -q "$url" -c "SELECT pg_stat_statements_reset()" >/dev/null
read -r b0 c0 r0 y0 f0 s0 sb0 n0 < <(snap); cpu0=$(cpu); t0=$(date +%s.%N)
tail -n +$((warm + 1)) $w/work | head -n $n | xargs -P $conc -L 1 bash -c "$op"' "$@"' _ > $w/run.codes
t1=$(date +%s.%N); cpu1=$(cpu)
stop; sleep 1.5
read -r b1 c1 r1 y1 f1 s1 sb1 n1 < <(snap)
k=$((n1-n0)); hz=$(getconf CLK_TCK)
printf "%s: %d ${op}s (%.0f/s; codes %s) · per $op: buffers %.0f (statements %.0f) · WAL records %.1f · WAL bytes %.0f · FPI %.2f · commits %.2f · statements %.1f · PG CPU %.2f ms\n" \
  "$label" $k "$(echo "$k/($t1-$t0)" | bc -l)" "$(sort $w/run.codes | uniq -c | tr -s ' ' | tr '\n' ',')" \
  "$(echo "($b1-$b0)/$k" | bc -l)" "$(echo "($sb1-$sb0)/$k" | bc -l)" "$(echo "($r1-$r0)/$k" | bc -l)" "$(echo "($y1-$y0)/$k" | bc -l)" "$(echo "($f1-$f0)/$k" | bc -l)" \
  "$(echo "($c1-$c0)/$k" | bc -l)" "$(echo "($s1-$s0)/$k" | bc -l)" "$(echo "($cpu1-$cpu0)*1000/$hz/$k" | bc -l)"
echo "per statement, per $op: calls · buffers · WAL records · WAL bytes · query"
psql -q "$url" -At -c "SELECT round(calls::numeric/$k,2) AS per_op, round((shared_blks_hit+shared_blks_read)::numeric/$k,1) AS buf_per_op, round(wal_records::numeric/$k,1) AS walrec_per_op, round(wal_bytes::numeric/$k) AS walb_per_op, left(regexp_replace(query, '\s+', ' ', 'g'), 120) FROM pg_stat_statements s JOIN pg_database d ON d.oid=s.dbid WHERE d.datname='$db' ORDER BY shared_blks_hit+shared_blks_read DESC LIMIT 30"
psql -q "$srv" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
