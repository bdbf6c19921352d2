#!/usr/bin/env bash
# vegeta-targets.sh — reset the app and write a vegeta targets file in which
# every Idempotency-Key appears REPEAT times (default 3): the first copy
# executes, the others are replayed (or refused 409 while it is in flight).
#
#   ./scripts/load/vegeta-targets.sh [BASE_URL] > targets.http
#   vegeta attack -targets targets.http -rate 200/s -duration 20s | vegeta report
#
# Env: ADMIN_TOKEN (demo-admin), USERS (50), POLICIES (20 per user),
# SLOTS (8), REPEAT (3). Needs curl and jq, and an app with DEMO_MODE=true and RATE_LIMIT_EXEMPT=127.0.0.1.
# The file holds one cancellation per policy (USERS × POLICIES intents) and
# as many bookings on the SLOTS slots, interleaved, each line group REPEAT
# times in a row so copies of a key go out within milliseconds.
set -euo pipefail

BASE="${1:-http://localhost:8080}"
ADMIN="${ADMIN_TOKEN:-demo-admin}"
USERS="${USERS:-50}" POLICIES="${POLICIES:-20}" SLOTS="${SLOTS:-8}" REPEAT="${REPEAT:-3}"
run="$(date +%s)"

reset=$(curl -fsS -X POST "$BASE/api/v1/admin/reset" -H "Authorization: Bearer $ADMIN" \
	-H 'Content-Type: application/json' \
	-d "{\"users\": $USERS, \"policies_per_user\": $POLICIES, \"slots\": $SLOTS}")
body="$(mktemp -d)/cancel.json"
echo '{"reason":"vegeta"}' >"$body"
echo "# vegeta targets for $BASE: keys repeat $REPEAT times; bodies in $body" >&2

slots=$(curl -fsS "$BASE/api/v1/slots?limit=1000" -H "Authorization: Bearer $ADMIN" | jq -r '.items[].id')
mapfile -t slot_ids <<<"$slots"

n=0
# One line per customer: "name token".
while read -r name token; do
	for policy in $(curl -fsS "$BASE/api/v1/policies?status=ACTIVE&limit=1000" -H "Authorization: Bearer $token" | jq -r '.items[].id'); do
		n=$((n + 1))
		slot="${slot_ids[$((n % ${#slot_ids[@]}))]}"
		for _ in $(seq "$REPEAT"); do
			printf 'POST %s/api/v1/policies/%s/cancel\nAuthorization: Bearer %s\nIdempotency-Key: vegeta-%s-cancel-%s\nContent-Type: application/json\n@%s\n\n' \
				"$BASE" "$policy" "$token" "$run" "$policy" "$body"
		done
		for _ in $(seq "$REPEAT"); do
			printf 'POST %s/api/v1/slots/%s/book\nAuthorization: Bearer %s\nIdempotency-Key: vegeta-%s-book-%s\n\n' \
				"$BASE" "$slot" "$token" "$run" "$n"
		done
	done
done < <(jq -r '.users[] | select(.role == "customer") | "\(.name) \(.token)"' <<<"$reset")
echo "# $n cancellations and $n bookings, $((2 * n * REPEAT)) requests" >&2
