// Package recovery is the recovery loop: it finds operations whose owner
// looks dead, claims them, and hands each to the Recoverer registered for its
// operation type, which reconstructs what really happened and finishes it.
//
// A timeout leaves an operation IN_PROGRESS: missing information, not a
// failure. Retry repeats a step; recovery first asks what happened.
//
// # States of an operation, as recovery sees them
//
//	             request crashed, or handed over (outcome unknown)
//	IN_PROGRESS ──────── lease expired ───────┐
//	     │                                    ▼
//	     │ request finished           claim (new owner token, new lease)
//	     ▼                                    │
//	SUCCEEDED | FAILED          ┌──────── RECOVERING ◄───────────────┐
//	                            │   poll: renew lease (fenced), wait │
//	                            │         └──────────────────────────┘
//	                            ├─ provider COMPLETED ─────► SUCCEEDED
//	                            ├─ provider REJECTED ──────► FAILED
//	                            ├─ NOT_STARTED / still unknown + idempotent:
//	                            │     same call, same key ─► SUCCEEDED | FAILED | backoff
//	                            ├─ backoff: attempts+1, next_attempt_at, lease released
//	                            │     └─ claimed again when due (back to RECOVERING)
//	                            └─ still unknown + not idempotent, or out of attempts
//	                                                   ───► NEEDS_RECONCILIATION
//	                                                          │ a person decides
//	                                                          ▼ SUCCEEDED | FAILED | IN_PROGRESS (retry)
//
// # Where the claim lives
//
// The loop knows no table. A Claimer claims stale operations of one table
// and keeps its SQL next to that table's other statements: for
// policy_operations that is policies.Recovery (internal/policies/claim.go),
// which is also the cancellation's Recoverer (recover.go). A later workflow
// with its own table brings its own claimer; the loop, the budget and the
// metrics stay as they are. Operation types are dispatched by Register.
//
// # Two claim strategies
//
// SkipLocked: one transaction selects a batch with FOR UPDATE SKIP LOCKED,
// transitions it to RECOVERING and records the events. Workers never wait
// for each other and never see each other's rows; a batch is one round
// trip. Transition: candidates are read without a lock, then each is
// claimed by one conditional UPDATE … WHERE id = $1 AND status = <as seen>
// AND <still stale> RETURNING — one row is mine, zero rows means someone
// else got there first. It needs no long lock and works where SKIP LOCKED
// does not; workers may compete for the same candidates, and the losers
// simply get zero rows. Both are tested with three loops on 300 operations.
//
// # Invariants the package keeps (with its Claimer and Recoverers)
//
//  1. At most one worker owns an operation at a time: a claim needs the
//     lease expired and installs a new owner token in the same statement.
//  2. Every write by a worker carries AND owner_token = <its token> (the
//     fence). A worker whose lease lapsed and was taken over writes nothing:
//     its next write matches zero rows (ErrLeaseLost) and it stops.
//  3. A finished operation (SUCCEEDED, FAILED) is never overwritten: every
//     fenced write also requires status IN ('IN_PROGRESS', 'RECOVERING').
//  4. Recovery asks before it acts: the call is sent again only when the
//     provider has no record of it (NOT_STARTED), or when it is idempotent.
//     A call to a provider that is not idempotent is never repeated blindly.
//  5. Every claim and every decision writes a timeline event, in the same
//     transaction, naming the worker and the branch of the decision tree.
//  6. Bounded: with faults off, a stale operation is finished within about
//     Interval + Budget.MaxPollTime + Lease of becoming stale (Loop.Bound);
//     unknown outcomes back off and end in reconciliation after
//     MaxAttempts.
//
// Time comes from the database clock. Tests move it (SetNow in
// export_test.go) rather than sleep.
package recovery
