// Package fake is a stand-in for the external insurance provider: an HTTP
// service with its own API, its own durable state (the fake_provider schema)
// and every failure a caller cannot tell apart, on demand and
// deterministically. It is to package provider what net/http/httptest is to
// net/http. The fault machinery — modes, scripts, overrides, flaky draws,
// holding connections, deadline refusals, the control API — is
// internal/fault's, shared with the payments fake; this package adds the
// cancellations and the effects ledger.
//
// # A key's life
//
// The provider keeps one record per idempotency key. Its truth is computed
// when read (fake_provider.truth in the migration), so RUNNING turns into
// COMPLETED by the database clock alone, with no background process:
//
//	                 accepted (ok, lost_response)
//	NOT_STARTED ──────────────────────────────────────────► COMPLETED
//	     │  │                                                   ▲
//	     │  │ accepted (slow)                                   │ completes_at passes
//	     │  └─────────────────────────► RUNNING ────────────────┘
//	     │ refused (reject)
//	     └────────────────────────────► REJECTED
//
//	error, drop and a call arriving after its Request-Deadline leave the key
//	NOT_STARTED: nothing is recorded but, for the late call, its refusal.
//
// # Modes
//
// The table is in internal/fault's doc. A call is governed by the oldest
// matching script entry, then its policy's override ("policy_id": n), then
// the global fault. A slow call's effect row is written at acceptance with
// applied_at = completes_at, so it is durable at once and counts in the
// ledger from its completion on. Once a call has arrived it is processed to
// the end whether or not the caller stays, so a latency beyond the caller's
// timeout turns ok into a lost response.
//
// # Deadlines
//
// A cancellation arriving after its Request-Deadline is answered 408
// deadline_passed before any fault is consulted: nothing applied, the key
// stays NOT_STARTED (or keeps the truth an earlier, on-time call gave it),
// and GET /v1/effects lists it under "late". That is what makes NOT_STARTED
// conclusive for a caller once every deadline it sent has passed.
//
// # Idempotency switch
//
// idempotent (the default): a repeat of a processed key applies nothing and
// answers the key's record — 200 COMPLETED, 422 REJECTED, or 202 RUNNING
// while a slow key runs (a repeat under mode slow waits for the completion
// like the first call did). Not idempotent: a repeat is processed again and
// appends a second effect row; an acceptance then overrides an earlier
// refusal and the earliest completion stands. error and drop apply to
// repeats too: the repeat never gets in.
//
// # Invariants the package keeps
//
//   - An idempotent provider writes at most one effect row per key, however
//     many copies of a call race: the first INSERT … ON CONFLICT on the
//     request's primary key wins and the others wait for its commit, then
//     take the repeat path.
//   - No call arriving after its deadline writes a request or an effect.
//   - A call that timed out at the caller leaves no goroutine behind: every
//     held handler returns once its caller's connection closes.
//
// Status queries (GET /v1/cancellations/{key}) have their own fault,
// status_mode on the global fault: ok answers the truth, error answers
// 503, drop holds the connection.
package fake
