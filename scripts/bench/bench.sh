#!/usr/bin/env bash
# bench.sh — `make bench`: the app against the floor of its own database work,
# on this machine, in one run. docs/performance.md explains the method.
#
#   (a) pgbench running the app's SQL for one cancellation (cancel.sql), one
#       booking of a free slot (book-free.sql) and one booking attempt under
#       contention (book.sql) — the same commits, no HTTP, no Go;
#   (b) the app over HTTP doing the same work (cmd/loadtest, workloads cancel,
#       book-free and book), provider and payments ok, each a process of its
#       own, with what each answer cost (CPU of the app, the fakes and
#       PostgreSQL; buffers; WAL); its events are
#       delivered by no process during these runs (EVENTS_WORKERS=off, as
#       when `web events` runs elsewhere): the floors deliver none either.
#       One more cancellation run with the delivery in the same process
#       (relay and both consumers: their commits on top) says what it costs;
#   (c) the replay of completed keys (cmd/loadtest, workload replay);
#   (d) recovery: 10,000 stale operations, two app instances, time to drain;
#   (e) events: 10,000 events through both consumers, per transport;
#   (f) events: the lag while the cancellation workload runs (events-lag.sh).
#
# Each run of (a) and (b) is readied alike: a fresh dataset, a warm-up of the
# same workload (WARMUP_SECONDS, not measured), VACUUM ANALYZE, CHECKPOINT —
# so every connection's cached plans fit tables that are no longer empty
# (docs/performance.md, "plans made for an empty table").
#
# Env: DATABASE_URL (the server; a database idemlab_bench is created and
# dropped), BENCH_SECONDS (10), WARMUP_SECONDS (4), CLIENTS (16), BOOK_CLIENTS (32), BOOK_SLOTS (8),
# DB_MAX_CONNS (the app's pool, default 8), STALE_OPS (10000), RECOVERY_WAIT (60).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable}"
db="idemlab_bench"
url="${server/\/postgres\?/\/$db?}"
secs="${BENCH_SECONDS:-10}" warm="${WARMUP_SECONDS:-4}" clients="${CLIENTS:-16}" book_clients="${BOOK_CLIENTS:-32}" book_slots="${BOOK_SLOTS:-8}"
stale="${STALE_OPS:-10000}" recovery_wait="${RECOVERY_WAIT:-60}"
pgbench="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"
work="$(mktemp -d)"
pids=()

cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
	psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
say() { printf '%s\n' "$*" >&2; }

say "bench: building web and loadtest"
(cd "$root" && go build -o "$work/web" ./cmd/web && go build -o "$work/loadtest" ./cmd/loadtest)
psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
DATABASE_URL="$url" "$work/web" migrate up >/dev/null 2>&1

# The fakes run as processes of their own (`web provider`, `web payments`),
# as the systems they stand for would: their CPU is theirs, not the app's
# (each run's cost line). Started once; every app calls them.
start_fake() { # start_fake NAME PORT
	local env; env="$(echo "$1" | tr a-z A-Z)"
	env DATABASE_URL="$url" "${env}_ADDR=127.0.0.1:$2" LOG_LEVEL=error "$work/web" "$1" >"$work/$1.log" 2>&1 &
	pids+=($!)
	eval "${1}_pid=$!"
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$2/" && return; sleep 0.1; done
	say "bench: $1 did not start"; cat "$work/$1.log" >&2; exit 1
}
start_fake provider 18170
start_fake payments 18171
# The database server's postmaster: its backends' CPU is the cost's "postgres".
postmaster_pid="$(head -1 "$(psql -tA "$url" -c 'SHOW data_directory' 2>/dev/null)/postmaster.pid" 2>/dev/null || true)"

# start_app NAME PORT EVENTS_WORKERS: one `web serve` on loopback, calling the
# fakes above; EVENTS_WORKERS off runs no relay and no consumers.
start_app() {
	EVENTS_WORKERS="$3" DATABASE_URL="$url" ADDR="127.0.0.1:$2" PROVIDER_URL=http://127.0.0.1:18170 PAYMENTS_URL=http://127.0.0.1:18171 DEMO_MODE=true RATE_LIMIT_EXEMPT=127.0.0.1 \
		SESSION_SECRET=bench-secret-0123456789abcdef0123 INSTANCE_ID="$1" LOG_LEVEL=error \
		"$work/web" serve >"$work/$1.log" 2>&1 &
	pids+=($!)
	app_pid=$!
	for _ in $(seq 100); do curl -fs "http://127.0.0.1:$2/readyz" >/dev/null 2>&1 && return; sleep 0.1; done
	say "bench: $1 did not start"; cat "$work/$1.log" >&2; exit 1
}
reset() { # reset USERS POLICIES_PER_USER SLOTS
	curl -fsS -X POST "$app/api/v1/admin/reset" -H 'Authorization: Bearer demo-admin' -H 'Content-Type: application/json' \
		-d "{\"users\": $1, \"policies_per_user\": $2, \"slots\": $3}" -o /dev/null
}
vacuum() { psql -q "$url" -c 'VACUUM ANALYZE' >/dev/null; psql -q "$url" -c 'CHECKPOINT' >/dev/null; }

# pgbench_run NAME SCRIPT CLIENTS [extra args]: the warm-up, VACUUM ANALYZE
# and CHECKPOINT, the measured run; prints "tps p99_ms".
pgbench_run() {
	local name="$1" script="$2" c="$3"; shift 3
	mkdir -p "$work/$name"
	if ((warm > 0)); then
		"$pgbench" -n -M prepared -c "$c" -j 2 -T "$warm" -f "$script" "$@" "$url" >/dev/null 2>&1 ||
			{ say "bench: pgbench warm-up of $name failed"; exit 1; }
	fi
	vacuum
	"$pgbench" -n -M prepared -c "$c" -j 2 -T "$secs" -f "$script" -l --log-prefix="$work/$name/log" "$@" "$url" \
		>"$work/$name/out" 2>&1 || { cat "$work/$name/out" >&2; exit 1; }
	local tps p99
	tps=$(sed -nE 's/^tps = ([0-9.]+).*/\1/p' "$work/$name/out" | head -1)
	# Column 3 of pgbench's per-transaction log is the latency in µs.
	p99=$(cat "$work/$name"/log* | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; printf "%.1f", a[i]/1000}')
	echo "$tps $p99"
}

# loadtest_run SCENARIO CLIENTS [flags]: the reset, the warm-up, VACUUM
# ANALYZE and CHECKPOINT (loadtest -vacuum), the measured run; prints
# "throughput p99_ms 5xx pass".
loadtest_run() {
	local s="$1" c="$2"; shift 2
	local cost="app=$app_pid,provider=$provider_pid,payments=$payments_pid${postmaster_pid:+,postgres=$postmaster_pid}"
	"$work/loadtest" -url "$app" -scenario "$s" -concurrency "$c" -warmup "${warm}s" -vacuum "$url" -duration "${secs}s" \
		-cost-pids "$cost" -json "$@" >"$work/$s.json" 2>/dev/null || true
	# What each 2xx answer cost (cmd/loadtest's cost.go), kept for the table's second half.
	jq -r --arg s "$s" '.cost // empty | [$s, .ops, (.cpu_ms.app // 0), ((.cpu_ms.provider // 0) + (.cpu_ms.payments // 0)),
		(.cpu_ms.postgres // "n/a"), .buffers, .wal_records, .wal_bytes] | @tsv' "$work/$s.json" >>"$work/costs.tsv"
	jq -r '"\(.throughput) \(.latency_ms.p99) \(.server_errors) \(.pass)"' "$work/$s.json"
}

app="http://127.0.0.1:18180"
start_app app-1 18180 off
app1_pid=$app_pid
psql -q "$url" -c 'CREATE SEQUENCE pgbench_policy_seq' -c 'CREATE SEQUENCE pgbench_key_seq' -c 'CREATE SEQUENCE pgbench_slot_seq' >/dev/null
free_slots="${FREE_SLOTS:-60000}"

say "bench: (a) pgbench, cancellation, $clients clients, ${secs}s"
reset 1000 100 8 && psql -q "$url" -f "$root/scripts/bench/policy-order.sql" >/dev/null
read -r pg_cancel_tps pg_cancel_p99 < <(pgbench_run cancel "$root/scripts/bench/cancel.sql" "$clients")

say "bench: (a) pgbench, booking free slots, $clients clients, ${secs}s"
reset 0 1 "$free_slots"
read -r pg_free_tps pg_free_p99 < <(pgbench_run book-free "$root/scripts/bench/book-free.sql" "$clients")

say "bench: (a) pgbench, booking, $book_clients clients on $book_slots slots, ${secs}s"
reset 0 1 "$book_slots"
read -r pg_book_tps pg_book_p99 < <(pgbench_run book "$root/scripts/bench/book.sql" "$book_clients" -D slots="$book_slots")

say "bench: (b) app, cancellation, $clients clients, ${secs}s"
read -r app_cancel_tps app_cancel_p99 app_cancel_5xx app_cancel_pass < <(loadtest_run cancel "$clients" -users 1000 -policies-per-user 100)

say "bench: (b) app, booking free slots, $clients clients, ${secs}s"
read -r app_free_tps app_free_p99 app_free_5xx app_free_pass < <(loadtest_run book-free "$clients" -users 3 -policies-per-user 1 -slots "$free_slots")

say "bench: (b) app, cancellation, events delivered by the same process, $clients clients, ${secs}s"
start_app app-3 18200 on
app="http://127.0.0.1:18200"
read -r app_cancel_ev_tps app_cancel_ev_p99 app_cancel_ev_5xx app_cancel_ev_pass < <(loadtest_run cancel "$clients" -users 1000 -policies-per-user 100)
kill "${pids[-1]}" && wait "${pids[-1]}" 2>/dev/null || true
unset 'pids[-1]'
app="http://127.0.0.1:18180" app_pid=$app1_pid

say "bench: (c) app, replay of completed keys, $clients clients, ${secs}s"
read -r app_replay_tps app_replay_p99 app_replay_5xx app_replay_pass < <(loadtest_run replay "$clients" -users 200 -policies-per-user 10)

say "bench: (b) app, booking, $book_clients clients on $book_slots slots, ${secs}s"
read -r app_book_tps app_book_p99 app_book_5xx app_book_pass < <(loadtest_run book "$book_clients" -users 200 -policies-per-user 1 -slots "$book_slots")

say "bench: (d) recovery, $stale stale operations, two instances"
reset $((stale / 100)) 100 8
psql -q "$url" >/dev/null <<SQL
-- Operations whose owner died mid-call: IN_PROGRESS, lease run out a minute
-- ago, the provider never reached (NOT_STARTED): recovery must call it.
WITH o AS (
    INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
                            owner_token, owner_id, lease_expires_at)
    SELECT id, 'CANCEL', user_id, 'bench-stale-' || id, 'IN_PROGRESS',
           gen_random_uuid(), 'bench: a process that died', now() - interval '1 minute'
      FROM policies
     ORDER BY id
     LIMIT $stale
    RETURNING id)
-- their steps: the intent recorded, nothing sent
INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, finished_at)
SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system,
       CASE WHEN s.position = 1 THEN 'DONE' ELSE 'PENDING' END,
       CASE WHEN s.position = 1 THEN now() END
  FROM o,
       (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL),
               (4, 'publish_event', NULL), (5, 'refund', 'payments'), (6, 'audit', NULL)) AS s(position, name, system);
SQL
start_app app-2 18190 on
t0=$(date +%s.%N)
live=$stale
while :; do
	# A cheap count on the stale-scan index, not the full invariants check:
	# polling that every 0.2 s would compete with the recovery it measures.
	live=$(psql -qAt "$url" -c "SELECT count(*) FROM operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')")
	elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
	[[ "$live" -eq 0 ]] && break
	(($(echo "$elapsed > $recovery_wait" | bc))) && break
	sleep 0.2
done
recovery_ok=$(curl -fsS "$app/api/v1/invariants" -H 'Authorization: Bearer demo-admin' | jq .ok)

ratio() { echo "scale=2; $1 / $2" | bc; }
printf '\nidemlab bench — %s, %s vCPU, %s, fsync %s, %ss per run\n\n' "$(uname -m)" "$(nproc)" \
	"$(psql -tA "$url" -c 'SHOW server_version')" "$(psql -tA "$url" -c 'SHOW fsync')" "$secs"
printf '%-44s %12s %10s   %s\n' "workload" "per second" "p99 ms" "notes"
printf '%-44s %12.0f %10s   %s\n' "pgbench: cancellation (5 commits), $clients clients" "$pg_cancel_tps" "$pg_cancel_p99" "the floor"
printf "%-44s %12.0f %10.1f   %s\n" "app: cancellation, $clients clients" "$app_cancel_tps" "$app_cancel_p99" \
	"app/pgbench $(ratio "$app_cancel_tps" "$pg_cancel_tps") (target ≥ 0.80) · 5xx $app_cancel_5xx · pass $app_cancel_pass"
printf "%-44s %12.0f %10.1f   %s\n" "app: cancellation, events delivered in-process" "$app_cancel_ev_tps" "$app_cancel_ev_p99" \
	"app/pgbench $(ratio "$app_cancel_ev_tps" "$pg_cancel_tps") (the relay's and both consumers' commits too) · pass $app_cancel_ev_pass"
printf '%-44s %12.0f %10s   %s\n' "pgbench: booking a free slot (1 commit), $clients" "$pg_free_tps" "$pg_free_p99" "the floor"
printf "%-44s %12.0f %10.1f   %s\n" "app: booking a free slot, $clients clients" "$app_free_tps" "$app_free_p99" \
	"app/pgbench $(ratio "$app_free_tps" "$pg_free_tps") (target ≥ 0.80) · 5xx $app_free_5xx · pass $app_free_pass"
printf "%-44s %12.0f %10.1f   %s\n" "app: replay of a completed key, $clients clients" "$app_replay_tps" "$app_replay_p99" \
	"× cancellation $(ratio "$app_replay_tps" "$app_cancel_tps") (target ≥ 5) · pass $app_replay_pass"
printf '%-44s %12.0f %10s   %s\n' "pgbench: booking attempt, $book_clients on $book_slots slots" "$pg_book_tps" "$pg_book_p99" "attempts (+ release when won)"
printf "%-44s %12.0f %10.1f   %s\n" "app: booking, $book_clients clients on $book_slots slots" "$app_book_tps" "$app_book_p99" \
	"requests (book + release) · 5xx $app_book_5xx (target 0, p99 < 50) · pass $app_book_pass"
if [[ "$live" -eq 0 ]]; then
	printf '%-44s %12s %10s   %s\n' "recovery: $stale stale operations, 2 instances" "${elapsed}s" "" "target ≤ 60 s · invariants ok: $recovery_ok"
else
	printf '%-44s %12s %10s   %s\n' "recovery: $stale stale operations, 2 instances" "not done" "" \
		"$live still live after ${recovery_wait}s (target: none; RECOVERY_WAIT=300 to see when it drains)"
fi

# What each answer cost the machine, from the same runs (cmd/loadtest -cost-pids): the app's own Go,
# the two fakes (other systems' CPU, not the app's), PostgreSQL's backends, the database's buffers and
# the server's WAL — figures a busy machine changes far less than the rates above.
printf '\n%-44s %8s %9s %9s %10s %8s %8s %9s\n' "cost per 2xx answer (measured window)" "answers" "app ms" "fakes ms" "postgres ms" "buffers" "WAL rec" "WAL bytes"
if [[ -s "$work/costs.tsv" ]]; then
	awk -F'\t' '{ pg = ($5 == "n/a") ? "n/a" : sprintf("%.2f", $5)
		printf "%-44s %8d %9.2f %9.2f %10s %8.0f %8.1f %9.0f\n", "app: " $1, $2, $3, $4, pg, $6, $7, $8 }' "$work/costs.tsv"
fi

# (e) events: 10,000 events through both consumers, per transport (internal/events BenchmarkDrain).
say "bench: events drain, 10,000 events per transport"
(cd "$root" && go test -run '^$' -bench Drain -benchtime=1x ./internal/events/) 2>&1 |
	awk '/^BenchmarkDrain/ { split($1, n, "/"); sub(/-[0-9]+$/, "", n[2]);
		printf "%-44s %12s %10s   %s\n", "events: 10,000 through 2 consumers, " n[2], $5, "", $7 " s to drain" }'
say "bench: events lag at 250 events/s, one per transaction"
(cd "$root" && go test -run '^$' -bench LagAtRate -benchtime=1x ./internal/events/) 2>&1 |
	awk '/^BenchmarkLagAtRate/ { split($1, n, "/"); sub(/-[0-9]+$/, "", n[2]);
		for (i = 3; i < NF; i++) m[$(i + 1)] = $i;
		printf "%-44s %12s %10s   %s\n", "events: lag at 250/s, " n[2], "", m["ms-p99-lag"],
			"p50 " m["ms-p50-lag"] " ms · max " m["ms-max-lag"] " ms (target < 1000 ms)" }'
# (f) events: the lag while the cancellation workload runs, per transport (events-lag.sh).
say "bench: events lag under the cancellation workload, nats and river"
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
pids=()
WEB="$work/web" LOADTEST="$work/loadtest" BENCH_SECONDS="$secs" CLIENTS="$clients" "$root/scripts/bench/events-lag.sh"
