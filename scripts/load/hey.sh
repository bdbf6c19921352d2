#!/usr/bin/env bash
# hey.sh — what hey can show. hey sends one request, with one set of headers,
# many times; so it cannot mint a key per request. That makes it the right
# tool for the extreme retry storm: one key, hammered.
#
#   ./scripts/load/hey.sh [BASE_URL]
#
# Needs hey, curl and an app with DEMO_MODE=true and RATE_LIMIT_EXEMPT=127.0.0.1.
set -euo pipefail

BASE="${1:-http://localhost:8080}"
ADMIN="${ADMIN_TOKEN:-demo-admin}"
run="$(date +%s)"

curl -fsS -X POST "$BASE/api/v1/admin/reset" -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
	-d '{"users": 0, "policies_per_user": 5, "slots": 8}' -o /dev/null

echo "== 1. One cancellation, one key, 2,000 copies from 50 clients."
echo "   Expect: one 200 (the execution), the rest 200 replayed or 409 request-in-progress; one provider effect."
hey -n 2000 -c 50 -m POST -T application/json -d '{"reason":"hey"}' \
	-H "Authorization: Bearer demo-alice" -H "Idempotency-Key: hey-$run-cancel" \
	"$BASE/api/v1/policies/1/cancel"

echo "== 2. One slot, one key, 2,000 copies: one booking, replayed."
hey -n 2000 -c 50 -m POST \
	-H "Authorization: Bearer demo-bob" -H "Idempotency-Key: hey-$run-book" \
	"$BASE/api/v1/slots/1/book"

echo "== 3. Replay throughput: the same completed key again (compare with 1)."
hey -z 10s -c 16 -m POST -T application/json -d '{"reason":"hey"}' \
	-H "Authorization: Bearer demo-alice" -H "Idempotency-Key: hey-$run-cancel" \
	"$BASE/api/v1/policies/1/cancel"

echo "== The app's verdict (ok, 1 effect, 1 confirmed booking):"
curl -fsS "$BASE/api/v1/invariants" -H "Authorization: Bearer $ADMIN"; echo
