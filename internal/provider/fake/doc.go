// Package fake is a stand-in for the external insurance provider: an HTTP
// service with its own API, its own durable state (the fake_provider schema)
// and every failure a caller cannot tell apart, on demand and
// deterministically. It is to package provider what net/http/httptest is to
// net/http.
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
//	error and drop leave the key NOT_STARTED: nothing is recorded.
//
// # Modes
//
// The fault governing a call is, in order: the oldest matching script entry
// (PUT with "next": N queues one for the next N calls), the policy's override
// ("policy_id": n), the global fault ("policy_id": null). Flaky draws one of
// the concrete modes per call from its seed, its weights and its call
// number, so a seed replays the same sequence.
//
//	mode           provider does                        caller sees        truth afterwards
//	ok             applies the effect                   200 COMPLETED      COMPLETED
//	reject         records the refusal, no effect       422 REJECTED       REJECTED
//	error          nothing                              503                NOT_STARTED
//	drop           nothing; holds the connection        its own timeout    NOT_STARTED
//	lost_response  applies the effect; holds            its own timeout    COMPLETED
//	slow           accepts; answers at completion       timeout if slow_ms RUNNING, then
//	               (slow_ms later)                      > its timeout      COMPLETED
//	flaky          one of the above, drawn per call
//
// "Holds" is real: the handler keeps the connection open without a byte of
// answer until the caller gives up, the provider is closed, or Options.HoldCap
// passes, then aborts the connection. A slow call's effect row is written at
// acceptance with applied_at = completes_at, so it is durable at once and
// counts in the ledger from its completion on.
//
// latency_ms delays every answer that would be sent. Once a call has
// arrived it is processed to the end whether or not the caller stays, so a
// latency beyond the caller's timeout turns ok into a lost response.
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
//   - Each script entry is used exactly as many times as its "next", across
//     all replicas (a row lock on the head entry).
//   - A call that timed out at the caller leaves no goroutine behind: every
//     held handler returns once its caller's connection closes.
//
// Status queries (GET /v1/cancellations/{key}) have their own fault,
// status_mode on the global fault: ok answers the truth, error answers
// 503, drop holds the connection.
package fake
