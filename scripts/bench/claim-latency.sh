#!/bin/bash
# claim-latency.sh BINARY DBNAME PORT — hand-over → claim latency of a `web` binary with a 250 ms
# recovery interval while slow claims poll (docs/recovery.md "Claimed within about one interval").
# Build two binaries (two commits) and run it on each, side by side. It drops and creates DBNAME.
# Prints: operations, mean ms, median ms, max ms.
set -u
bin=$1; db=$2; port=$3
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
url="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable"
ppport=$((port+1)); payport=$((port+2))
DATABASE_URL=$url ADDR=127.0.0.1:$port PROVIDER_ADDR=127.0.0.1:$ppport PAYMENTS_ADDR=127.0.0.1:$payport DEMO_MODE=true \
  SESSION_SECRET=x LOG_LEVEL=error RECOVERY_INTERVAL=250ms PROVIDER_TIMEOUT=300ms PAYMENTS_TIMEOUT=2s \
  RECOVERY_POLL_INTERVAL=500ms RECOVERY_MAX_POLLS=8 EVENTS_WORKERS=off "$bin" serve >"${TMPDIR:-/tmp}/claim-latency-$db.log" 2>&1 &
pid=$!
for i in $(seq 50); do curl -fs http://127.0.0.1:$port/healthz >/dev/null && break; sleep 0.2; done
P=http://127.0.0.1:$ppport
n=0
for who in alice bob carol; do
  ids=$(curl -fs -H "Authorization: Bearer demo-$who" "http://127.0.0.1:$port/api/v1/policies" | grep -o '"id":[0-9]*' | cut -d: -f2)
  set -- $ids
  while [ $# -ge 2 ]; do
    a=$1; b=$2; shift 2
    curl -fs -X PUT $P/v1/faults -H 'Content-Type: application/json' -d '{"mode":"slow","slow_ms":4000}' >/dev/null
    curl -s -o /dev/null -X POST -H "Authorization: Bearer demo-$who" -H "Idempotency-Key: a-$a" http://127.0.0.1:$port/api/v1/policies/$a/cancel
    sleep 0.4
    curl -fs -X PUT $P/v1/faults -H 'Content-Type: application/json' -d '{"mode":"drop"}' >/dev/null
    curl -s -o /dev/null -X POST -H "Authorization: Bearer demo-$who" -H "Idempotency-Key: b-$b" http://127.0.0.1:$port/api/v1/policies/$b/cancel
    n=$((n+1))
  done
done
sleep 3
curl -fs -X PUT $P/v1/faults -H 'Content-Type: application/json' -d '{"mode":"ok"}' >/dev/null
sleep 8
psql -h 127.0.0.1 -U postgres -d $db -At -c "
WITH h AS (
  SELECT operation_id, max(at) FILTER (WHERE detail LIKE '%handed to recovery%') AS handed,
         min(at) FILTER (WHERE branch = 'claimed') AS claimed
    FROM operation_events GROUP BY operation_id)
SELECT count(*), round(avg(extract(epoch FROM claimed - handed) * 1000)), round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed - handed) * 1000)),
       round(max(extract(epoch FROM claimed - handed) * 1000))
  FROM h WHERE handed IS NOT NULL AND claimed > handed"
kill $pid; wait $pid 2>/dev/null
