// Package fault is the machinery every fake external system shares (the
// provider in internal/provider/fake, payments in internal/payments/fake):
// what it is told to do to the calls it receives, how it refuses a call that
// arrives too late, and how it holds a connection without answering. A fake
// adds only its own business state (cancellations; charges and refunds) and
// its own ledger.
//
// # Modes
//
// The fault governing a mutating call is, in order: the oldest matching
// script entry (PUT with "next": N queues one for the next N calls), the
// subject's override ("policy_id": n or "booking_id": n), the global fault
// (no subject). Flaky draws one of the concrete modes per call from its seed,
// its weights and its call number, so a seed replays the same sequence.
//
//	mode           the fake does                        caller sees        truth afterwards
//	ok             applies the effect                   200 COMPLETED      COMPLETED
//	reject         records the refusal, no effect       422 REJECTED       REJECTED
//	error          nothing                              503                NOT_STARTED
//	drop           nothing; holds the connection        its own timeout    NOT_STARTED
//	lost_response  applies the effect; holds            its own timeout    COMPLETED
//	slow           accepts; answers at completion       timeout if slow_ms RUNNING, then
//	               (slow_ms later)                      > its timeout      COMPLETED
//	flaky          one of the above, drawn per call
//
// "Holds" is real (Holder): the handler keeps the connection open without a
// byte of answer until the caller gives up, the fake closes, or the cap
// passes, then aborts the connection. latency_ms delays every answer that
// would be sent; status queries have their own status_mode (ok, error,
// drop), fake-wide. The idempotency switch ("idempotent") is each fake's to
// honour: a repeat of a processed key applies nothing new, or applies again.
//
// # Deadlines
//
// A status answer describes the past, not the requests still in flight. A
// call held in the network past its caller's timeout arrives later and, if
// accepted, takes effect after the caller was told NOT_STARTED. So every
// call carries Request-Deadline (internal/external), and Arrive refuses one
// that arrives after it, before any fault is consulted:
//
//	arrives ──► now() > deadline? ──yes──► late_arrivals row, 408 deadline_passed,
//	                 │                     nothing applied, no script entry used
//	                 no
//	                 ▼
//	            script entry / override / global ──► the mode decides
//
// The refusal is durable (fault.late_arrivals) and shows in the fake's
// ledger: "op-7:refund arrived 1.3 s after its deadline". "Arrives" is the
// database clock when the whole request has been read; the caller's deadline
// is on the caller's clock — on one host the same clock, elsewhere the skew
// margin a recoverer adds covers the difference.
//
// # Bounds
//
// Every number a fault carries is bounded (MaxSlowMS, MaxLatencyMS, MaxNext,
// MaxWeight, MaxSeed, MaxID) and flaky weights must sum to at least 1, so no
// setting can hold a connection for a day, overflow a sum or panic a draw.
// A value out of range is an *InvalidError naming the JSON field, answered
// 422 {"error":"invalid_fault","field":"slow_ms","message":…}; JSON that is
// not one fault object (syntax, unknown fields, trailing data) is 400, and a
// body that is not application/json is 415.
//
// # Invariants the package keeps
//
//   - Each script entry is used exactly as many times as its "next", across
//     all processes (a row lock on the head entry).
//   - A late call changes nothing but the late-arrival ledger.
//   - A held request leaves no goroutine behind: it returns once its caller's
//     connection closes or the fake closes.
//
// # Who may change the faults
//
// The control API (faults, reset, ledger) is guarded by Access: loopback
// callers only by default, a bearer token from anywhere when one is set
// (FAKE_CONTROL_TOKEN), or anyone in demo mode (Access.Open).
package fault
