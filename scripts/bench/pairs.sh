#!/usr/bin/env bash
# pairs.sh — the app against its pgbench floor, interleaved: in each round,
# each workload runs as pgbench and as the app back to back (the order
# turning over from one round to the next), so a machine whose speed drifts
# — shared, noisy — moves both sides of a pair alike. Prints every pair's
# ratio, then the min / median / max of the ratios. docs/performance.md
# explains the method; `make bench` is the full run, this the comparison.
#
#   scripts/bench/pairs.sh                       # 3 rounds, cancel and book-free
#   ROUNDS=5 WORKLOADS="cancel" scripts/bench/pairs.sh
#   BASE=main scripts/bench/pairs.sh             # and that revision's app, in the same rounds
#
# Env: DATABASE_URL (the server; databases idemlab_pairs[_base] are created
# and dropped), ROUNDS (3), WORKLOADS ("cancel book-free"), BENCH_SECONDS
# (10), WARMUP_SECONDS (4: see warm-up below), CLIENTS (16), DB_MAX_CONNS (the apps' pool, default 8), FREE_SLOTS
# (60000), PAIRS_PORT (23480), BASE (a git revision: its app runs too, on
# its own port and database, so a change is measured before and after in
# the same rounds), APP_ENV and BASE_ENV (settings for one app alone, such
# as "EVENTS_WORKERS=off DB_MAX_CONNS=16": BASE=HEAD BASE_ENV=… compares two
# settings of one build).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable}"
db="idemlab_pairs"
secs="${BENCH_SECONDS:-10}" warm="${WARMUP_SECONDS:-4}" clients="${CLIENTS:-16}" rounds="${ROUNDS:-3}"
workloads="${WORKLOADS:-cancel book-free}" free_slots="${FREE_SLOTS:-60000}"
pgbench="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"
work="$(mktemp -d)"
pids=()

cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
	if [[ -z "${KEEP_DB:-}" ]]; then
		psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP DATABASE IF EXISTS ${db}_base WITH (FORCE)" \
			>/dev/null 2>&1 || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
say() { printf '%s\n' "$*" >&2; }
dburl() { echo "${server/\/postgres\?/\/$1?}"; }

# The floors as they are now: an edit during the run changes nothing.
cp "$root"/scripts/bench/*.sql "$work/"
say "pairs: building web and loadtest"
(cd "$root" && go build -o "$work/web" ./cmd/web && go build -o "$work/loadtest" ./cmd/loadtest)
if [[ -n "${BASE:-}" ]]; then
	say "pairs: building web at $BASE"
	mkdir -p "$work/base-src"
	git -C "$root" archive "$BASE" | tar -x -C "$work/base-src"
	(cd "$work/base-src" && go build -o "$work/web-base" ./cmd/web)
fi

# start NAME DATABASE PORT BINARY [VAR=VALUE ...]: one `web serve` on loopback, its fakes on
# the next two ports, on a database of its own (created and migrated). The
# ports must be free: a readyz answered by another engineer's app would send
# this script's resets to that app's database.
start() {
	local name="$1" d="$2" p="$3" bin="$4" u
	shift 4
	u="$(dburl "$d")"
	for q in "$p" $((p + 1)) $((p + 2)); do
		if ss -ltn "sport = :$q" | grep -q LISTEN; then say "pairs: port $q is taken; set PAIRS_PORT"; exit 1; fi
	done
	psql -q "$server" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" -c "CREATE DATABASE $d" >/dev/null
	DATABASE_URL="$u" "$bin" migrate up >/dev/null 2>&1
	# The events stay in the outbox (the floor delivers none) unless the
	# settings given say otherwise (APP_ENV="EVENTS_WORKERS=on").
	env EVENTS_WORKERS=off "$@" DATABASE_URL="$u" ADDR="127.0.0.1:$p" PROVIDER_ADDR="127.0.0.1:$((p + 1))" PAYMENTS_ADDR="127.0.0.1:$((p + 2))" DEMO_MODE=true \
		RATE_LIMIT_EXEMPT=127.0.0.1 SESSION_SECRET=bench-secret-0123456789abcdef0123 INSTANCE_ID="$name" LOG_LEVEL=error \
		"$bin" serve >"$work/$name.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 100); do curl -fs "http://127.0.0.1:$p/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
	curl -fs "http://127.0.0.1:$p/readyz" >/dev/null || { cat "$work/$name.log" >&2; exit 1; }
	psql -q "$u" -c 'CREATE SEQUENCE pgbench_policy_seq' -c 'CREATE SEQUENCE pgbench_key_seq' -c 'CREATE SEQUENCE pgbench_slot_seq' >/dev/null
}
port="${PAIRS_PORT:-23480}"
# shellcheck disable=SC2086
start app "$db" "$port" "$work/web" ${APP_ENV:-}
app="http://127.0.0.1:$port" url="$(dburl "$db")"
if [[ -n "${BASE:-}" ]]; then
	# shellcheck disable=SC2086
	start base "${db}_base" $((port + 10)) "$work/web-base" ${BASE_ENV:-}
	base_app="http://127.0.0.1:$((port + 10))"
fi

reset() { # reset USERS POLICIES_PER_USER SLOTS: the app's data, ids from 1 again
	curl -fsS -X POST "$app/api/v1/admin/reset" -H 'Authorization: Bearer demo-admin' -H 'Content-Type: application/json' \
		-d "{\"users\": $1, \"policies_per_user\": $2, \"slots\": $3}" -o /dev/null
	psql -q "$url" -c 'ALTER SEQUENCE pgbench_policy_seq RESTART' -c 'ALTER SEQUENCE pgbench_slot_seq RESTART' >/dev/null
}
vacuum() { psql -q "$1" -c 'VACUUM ANALYZE' >/dev/null; psql -q "$1" -c 'CHECKPOINT' >/dev/null; }

# Both sides are readied alike: a fresh dataset, a warm-up of the same
# workload (WARMUP_SECONDS, not measured), VACUUM ANALYZE and CHECKPOINT,
# then the measured run. The warm-up matters: a reset leaves the operation
# tables empty, and a prepared statement's plan, cached by each connection
# after its fifth use, is made for the table as it is then — a sequential
# scan of a table of one page, kept while the table grows to thousands of
# pages. ANALYZE after the warm-up makes every connection plan again for the
# data as it now is (docs/performance.md, "plans made for an empty table").

# floor WORKLOAD: pgbench on a fresh dataset; prints "tps p50_ms p99_ms".
floor() {
	local name="$1" n="$work/pg-$1-$RANDOM"
	case "$name" in
	cancel) reset 1000 100 8 && psql -q "$url" -f "$work/policy-order.sql" >/dev/null ;;
	book-free) reset 0 1 "$free_slots" ;;
	esac
	if ((warm > 0)); then
		"$pgbench" -n -M prepared -c "$clients" -j 2 -T "$warm" -f "$work/$name.sql" "$url" >/dev/null 2>&1 ||
			{ say "pairs: pgbench warm-up failed"; exit 1; }
	fi
	vacuum "$url"
	mkdir -p "$n"
	"$pgbench" -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$work/$name.sql" -l --log-prefix="$n/log" "$url" \
		>"$n/out" 2>&1 || { cat "$n/out" >&2; exit 1; }
	local tps
	tps=$(sed -nE 's/^tps = ([0-9.]+).*/\1/p' "$n/out" | head -1)
	# Column 3 of pgbench's per-transaction log is the latency in µs.
	cat "$n"/log* | awk '{print $3}' | sort -n |
		awk -v tps="$tps" '{a[NR]=$1} END {p50=int(NR*0.5); p99=int(NR*0.99); if (p50<1) p50=1; if (p99<1) p99=1;
			printf "%.1f %.1f %.1f\n", tps, a[p50]/1000, a[p99]/1000}'
}

# app_run WORKLOAD URL DATABASE: cmd/loadtest (it resets the data itself);
# prints "tps p50_ms p99_ms pass".
app_run() {
	local name="$1" out="$work/app-$1-$RANDOM.json"
	local -a data
	case "$name" in cancel) data=(-users 1000 -policies-per-user 100) ;; book-free) data=(-users 3 -policies-per-user 1 -slots "$free_slots") ;; esac
	"$work/loadtest" -url "$2" -scenario "$name" -concurrency "$clients" -warmup "${warm}s" -vacuum "$3" -duration "${secs}s" \
		-json "${data[@]}" >"$out" 2>/dev/null || true
	jq -r '"\(.throughput) \(.latency_ms.p50) \(.latency_ms.p99) \(.pass)"' "$out"
}

printf '%-10s %5s %9s %7s %7s %9s %7s %7s %5s %6s' workload round "pg /s" "pg p50" "pg p99" "app /s" "p50" "p99" pass ratio
[[ -n "${BASE:-}" ]] && printf ' %9s %7s %7s %5s %6s' "base /s" "p50" "p99" pass ratio
echo
declare -A ratios base_ratios
for r in $(seq "$rounds"); do
	for w in $workloads; do
		say "pairs: round $r, $w"
		# The order turns over each round: pgbench, app (, base), then (base,) app, pgbench.
		if ((r % 2)); then
			read -r pt p50 p99 < <(floor "$w")
			read -r at a50 a99 ok < <(app_run "$w" "$app" "$url")
			[[ -n "${BASE:-}" ]] && read -r bt b50 b99 bok < <(app_run "$w" "$base_app" "$(dburl "${db}_base")")
		else
			[[ -n "${BASE:-}" ]] && read -r bt b50 b99 bok < <(app_run "$w" "$base_app" "$(dburl "${db}_base")")
			read -r at a50 a99 ok < <(app_run "$w" "$app" "$url")
			read -r pt p50 p99 < <(floor "$w")
		fi
		ratio=$(echo "scale=3; $at / $pt" | bc)
		ratios[$w]+="$ratio "
		printf '%-10s %5s %9.0f %7s %7s %9.0f %7.1f %7.1f %5s %6.2f' "$w" "$r" "$pt" "$p50" "$p99" "$at" "$a50" "$a99" "$ok" "$ratio"
		if [[ -n "${BASE:-}" ]]; then
			bratio=$(echo "scale=3; $bt / $pt" | bc)
			base_ratios[$w]+="$bratio "
			printf ' %9.0f %7.1f %7.1f %5s %6.2f' "$bt" "$b50" "$b99" "$bok" "$bratio"
		fi
		echo
	done
done
echo
summary() { # summary LABEL RATIO...
	local label="$1"
	shift
	printf '%s\n' "$@" | sort -n | awk -v l="$label" '{a[NR]=$1} END {
		printf "%-34s over %d rounds: min %.2f · median %.2f · max %.2f\n", l, NR, a[1], a[int((NR+1)/2)], a[NR]}'
}
for w in $workloads; do
	# shellcheck disable=SC2086
	summary "$w: app/pgbench" ${ratios[$w]}
	if [[ -n "${BASE:-}" ]]; then
		# shellcheck disable=SC2086
		summary "$w: app at $BASE ${BASE_ENV:-}/pgbench" ${base_ratios[$w]}
	fi
done
