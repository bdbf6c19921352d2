// Package fake is a stand-in for the payments service: an HTTP service with
// its own API, its own durable state (the fake_payments schema: charges,
// refunds, a ledger) and every fault of internal/fault — the same modes,
// scripts, per-subject overrides (a policy or a booking), latency,
// idempotency switch, status-query faults and deadline refusals as the fake
// provider, from the same code. It is to package payments what
// net/http/httptest is to net/http.
//
// # A key's life
//
// Charges and refunds each keep one record per idempotency key, with the
// truth computed when read (fault.truth), so RUNNING turns into COMPLETED by
// the database clock alone:
//
//	                 accepted (ok, lost_response)
//	NOT_STARTED ──────────────────────────────────────────► COMPLETED
//	     │  │                                                   ▲
//	     │  │ accepted (slow)                                   │ completes_at passes
//	     │  └─────────────────────────► RUNNING ────────────────┘
//	     │ refused (reject, or a refund the charge cannot cover)
//	     └────────────────────────────► REJECTED
//
//	error, drop and a call arriving after its Request-Deadline leave the key
//	NOT_STARTED; the late call's refusal is in the ledger's "late".
//
// # Money
//
// A charge is for a booking (a deposit) or a policy. A refund gives back
// part or all of a charge (by the charge's key) or a policy's premium paid
// elsewhere (by policy id). A refund of a charge is refused — a business
// answer, 422 REJECTED with the reason — when the charge is unknown, not
// COMPLETED, or would be over-refunded; the charge's row lock serialises
// refunds of one charge, so two refunds cannot both take what remains.
//
// # Idempotency switch
//
// idempotent (the default): at most one charge and one refund per key,
// however many copies race; a repeat answers the key's record. Not
// idempotent: each processed repeat moves money again and adds a ledger
// row, so a double refund is there to see in GET /v1/ledger (a policy's
// "refunds": 2).
//
// # Invariants the package keeps
//
//   - An idempotent service writes at most one ledger row per key.
//   - The refunds of a charge never exceed it.
//   - No call arriving after its deadline writes a charge, a refund or a
//     ledger row.
//   - A call that timed out at the caller leaves no goroutine behind.
package fake
