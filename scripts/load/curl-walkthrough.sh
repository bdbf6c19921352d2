#!/usr/bin/env bash
# curl-walkthrough.sh — the idempotency protocol, one request at a time.
#
#   ./scripts/load/curl-walkthrough.sh [BASE_URL]
#
# Needs a running app started with DEMO_MODE=true and RATE_LIMIT_EXEMPT=127.0.0.1 (it resets the data
# first) and curl. Each step prints the request and the answer's status
# line, the headers that matter, and the body.
set -euo pipefail

BASE="${1:-http://localhost:8080}"
ADMIN="${ADMIN_TOKEN:-demo-admin}"
ALICE="${ALICE_TOKEN:-demo-alice}"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# show METHOD PATH TOKEN [KEY] [BODY]: send one request, print what came back.
show() {
	local method="$1" path="$2" token="$3" key="${4:-}" body="${5:-}"
	local args=(-sS -X "$method" "$BASE$path" -H "Authorization: Bearer $token" -D - -o /tmp/idemlab-body.$$)
	[[ -n "$key" ]] && args+=(-H "Idempotency-Key: $key")
	[[ -n "$body" ]] && args+=(-H 'Content-Type: application/json' -d "$body")
	echo "> $method $path${key:+  (Idempotency-Key: $key)}${body:+  $body}"
	curl "${args[@]}" | grep -iE '^(HTTP/|idempotent-replayed|retry-after|location|content-type)' | tr -d '\r' | sed 's/^/< /'
	sed 's/^/  /' /tmp/idemlab-body.$$; echo
	rm -f /tmp/idemlab-body.$$
}

step "Reset: 0 generated users, 5 policies per customer, 8 slots; the provider is healthy again"
curl -sS -X POST "$BASE/api/v1/admin/reset" -H "Authorization: Bearer $ADMIN" -H "Content-Type: application/json" \
	-d '{"users": 0, "policies_per_user": 5, "slots": 8}' -o /dev/null -w '< %{http_code}\n'

# Alice's first policy.
POLICY=$(curl -sS "$BASE/api/v1/policies?limit=1" -H "Authorization: Bearer $ALICE" | sed -E 's/.*"items":\[\{"id":([0-9]+).*/\1/')
KEY="walkthrough-$(date +%s)-$$"

step "1. First request: the key is claimed, the work runs, the answer is stored with the key"
show POST "/api/v1/policies/$POLICY/cancel" "$ALICE" "$KEY" '{"reason":"moving abroad"}'

step "2. The same request again (a retry after a lost answer): the stored answer, byte for byte, with Idempotent-Replayed: true — nothing runs twice"
show POST "/api/v1/policies/$POLICY/cancel" "$ALICE" "$KEY" '{"reason":"moving abroad"}'

step "3. The same key with a different body: 422 idempotency-key-reused — a key names one request"
show POST "/api/v1/policies/$POLICY/cancel" "$ALICE" "$KEY" '{"reason":"changed my mind"}'

step "4. A second key for the same intent (a double-click that minted two keys): 409 duplicate-intent — UNIQUE(policy_id, operation_type) stops it, not the key"
show POST "/api/v1/policies/$POLICY/cancel" "$ALICE" "$KEY-second"

step "5. Same key while the first is still running: make the provider slow for the next call, send, and retry at once"
curl -sS -X PUT "$BASE/api/v1/provider/faults" -H "Authorization: Bearer $ADMIN" -H "Content-Type: application/json" \
	-d '{"mode":"ok","idempotent":true,"latency_ms":1500,"next":1}' -o /dev/null -w '< provider: next call answers after 1.5 s (%{http_code})\n'
POLICY2=$((POLICY + 1))
KEY2="$KEY-slow"
show POST "/api/v1/policies/$POLICY2/cancel" "$ALICE" "$KEY2" >/tmp/idemlab-first.$$ &
sleep 0.5
echo "(the first request is still waiting on the provider)"
show POST "/api/v1/policies/$POLICY2/cancel" "$ALICE" "$KEY2"
echo "  409 request-in-progress with Retry-After: come back later for the answer."
wait
echo "(the first request, when it finished:)"
cat /tmp/idemlab-first.$$; rm -f /tmp/idemlab-first.$$

step "6. Retry after Retry-After: now the stored answer"
show POST "/api/v1/policies/$POLICY2/cancel" "$ALICE" "$KEY2"

step "7. No key on a mutating route: 400 idempotency-key-missing"
show POST "/api/v1/policies/$((POLICY + 2))/cancel" "$ALICE"

step "8. And the app's own verdict"
curl -sS "$BASE/api/v1/invariants" -H "Authorization: Bearer $ADMIN"; echo
