#!/usr/bin/env bash
# events-lag.sh — the events' lag while the cancellation benchmark runs
# (issue 14), per transport: one `web serve` with EVENTS_TRANSPORT=nats,
# then river, each under cmd/loadtest's cancellation workload (the same as
# make bench's (b)); then, for every event the run wrote, the time from the
# writer's insert (outbox.created_at, clock_timestamp() inside the business
# transaction) to the later of the two consumers' inbox rows (applied_at,
# the consumer transaction's start). Prints one line per transport in the
# format of bench.sh's table. docs/events.md and docs/performance.md explain.
#
# Env: DATABASE_URL (the server; a database idemlab_lag is created and
# dropped), BENCH_SECONDS (10), CLIENTS (16), NATS_URL (nats://127.0.0.1:4222),
# TRANSPORTS ("nats river"), WEB (a built `web`; built here when unset),
# LOADTEST (likewise).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable}"
db="idemlab_lag"
url="${server/\/postgres\?/\/$db?}"
secs="${BENCH_SECONDS:-10}" clients="${CLIENTS:-16}"
work="$(mktemp -d)"
pid=""

cleanup() {
	[[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
say() { printf '%s\n' "$*" >&2; }

web="${WEB:-}" loadtest="${LOADTEST:-}"
if [[ -z "$web" || -z "$loadtest" ]]; then
	(cd "$root" && go build -o "$work/web" ./cmd/web && go build -o "$work/loadtest" ./cmd/loadtest)
	web="$work/web" loadtest="$work/loadtest"
fi

for transport in ${TRANSPORTS:-nats river}; do
	psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null 2>&1
	DATABASE_URL="$url" "$web" migrate up >/dev/null 2>&1
	app="http://127.0.0.1:18380"
	DATABASE_URL="$url" ADDR="127.0.0.1:18380" PROVIDER_ADDR="127.0.0.1:18381" PAYMENTS_ADDR="127.0.0.1:18382" \
		DEMO_MODE=true RATE_LIMIT_EXEMPT=127.0.0.1 SESSION_SECRET=bench-secret-0123456789abcdef0123 \
		INSTANCE_ID="lag-$transport" LOG_LEVEL=error EVENTS_TRANSPORT="$transport" \
		"$web" serve >"$work/$transport.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do curl -fs "$app/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
	curl -fs "$app/readyz" >/dev/null || { say "events-lag: the $transport app did not start"; cat "$work/$transport.log" >&2; exit 1; }

	say "events-lag: cancellation load, $clients clients, ${secs}s, EVENTS_TRANSPORT=$transport"
	"$loadtest" -url "$app" -scenario cancel -concurrency "$clients" -duration "${secs}s" -json \
		-users 1000 -policies-per-user 100 >"$work/$transport.json" 2>/dev/null || true
	# Every event of the run applied by both consumers (the loadtest waited
	# for recovery; the consumers may still be catching up).
	for _ in $(seq 600); do
		left=$(psql -qAt "$url" -c "SELECT (SELECT 2 * count(*) FROM outbox) - (SELECT count(*) FROM inbox)")
		[[ "$left" -le 0 ]] && break
		sleep 0.1
	done
	read -r events p50 p99 max < <(psql -qAt -F ' ' "$url" -c "
		SELECT count(*),
		       round(1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY lag)),
		       round(1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY lag)),
		       round(1000 * max(lag))
		  FROM (SELECT extract(epoch FROM max(i.applied_at) - o.created_at) AS lag
		          FROM outbox o
		          JOIN inbox i ON i.event_id = o.id
		         GROUP BY o.id, o.created_at
		        HAVING count(*) = 2) l")
	# The relay's part (insert → SENT; River's rows are SENT in the writer's commit).
	relay_p99="—"
	[[ "$transport" == river ]] || relay_p99="$(psql -qAt "$url" -c "SELECT round(1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at))) FROM outbox") ms"
	if [[ -n "${LAG_DEBUG:-}" ]]; then
		psql "$url" -c "SELECT date_trunc('second', o.created_at) AS second, count(DISTINCT o.id) AS events,
		                       round(avg(extract(epoch FROM o.sent_at - o.created_at))::numeric, 3) AS to_sent,
		                       round(avg(extract(epoch FROM i.applied_at - o.created_at))::numeric, 3) AS to_applied
		                  FROM outbox o JOIN inbox i ON i.event_id = o.id GROUP BY 1 ORDER BY 1" >&2
	fi
	rate=$(jq -r '.throughput' "$work/$transport.json")
	printf '%-44s %12.0f %10s   %s\n' "events: lag under cancellation, $transport" "$rate" "$p99" \
		"p50 $p50 ms · max $max ms · relay p99 $relay_p99 · $events events (target p99 < 1000 ms)"
	kill "$pid" && wait "$pid" 2>/dev/null || true
	pid=""
done
