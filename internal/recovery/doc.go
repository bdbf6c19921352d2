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
//	SUCCEEDED | FAILED          ┌──────── RECOVERING ◄───────────────┐   resume at the first
//	                            │   poll: renew lease (fenced), wait │   step not DONE; for an
//	                            │         └──────────────────────────┘   external step, ask:
//	                            ├─ COMPLETED ─────────► step DONE, run on ─► SUCCEEDED
//	                            ├─ REJECTED ──────────► FAILED (or a person, after a step that stands)
//	                            ├─ NOT_STARTED, every deadline + skew passed:
//	                            │     same call, same key ─► run on | backoff
//	                            ├─ NOT_STARTED, a call may still arrive: wait for its deadline
//	                            ├─ unreachable + believed idempotent: same call, same key
//	                            ├─ backoff: attempts+1, next_attempt_at, lease released
//	                            │     └─ claimed again when due (back to RECOVERING)
//	                            └─ out of attempts, right after a status query
//	                               that could not settle it ───► NEEDS_RECONCILIATION
//	                                                  │ asked again when due: known → RECOVERING
//	                                                  │ a person decides
//	                                                  ▼ SUCCEEDED | FAILED | IN_PROGRESS (retry)
//
// # Where the claim lives
//
// The loop knows no table. One Claimer claims the stale operations of every
// kind from the one operations table and keeps its SQL next to that table's
// other statements: workflow.Engine (internal/workflow/claim.go), which is
// also the Recoverer of every workflow registered with it (recover.go).
// The loop dispatches each claim by its operation type (Register), so a
// deploy that does not know a type leaves its operations alone.
//
// # A pass does not wait
//
// A pass claims as many operations as there are free places (Config.BatchSize
// minus those being recovered) and starts recovering each; it does not wait
// for them. A recovery that polls a system saying RUNNING for seconds never
// holds back the claim of an operation handed over a moment later: that one
// is claimed at the next pass, within about one Interval.
//
// # Why an operation was claimable
//
// Each claim says why (Claim.Reason, and the timeline): handed over on
// purpose (its owner met an unknown outcome and ended its lease), its
// backoff over, its owner's lease run out (the owner looks dead), or —
// for an operation waiting for a person — due to be asked again.
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
//     system has no record of it (NOT_STARTED) once every earlier attempt's
//     deadline plus Budget.ClockSkew has passed, or when the app believes the
//     system idempotent. A call to a system that is not is never repeated
//     blindly; unreachable, it is asked again later, and a person decides
//     only after a last status query that could not settle it.
//  5. Every claim and every decision writes a timeline event, in the same
//     transaction, naming the worker and the branch of the decision tree.
//  6. Bounded: with faults off, an operation is finished within about
//     Interval + Budget.MaxPollTime + Lease of becoming claimable, one
//     Lease more from its owner's crash, after any backoff in force (at
//     most MaxBackoff) — Loop.Bounds, the one computation every page quotes;
//     unknown outcomes back off and end in reconciliation after
//     MaxAttempts.
//
// Time comes from the database clock (database.Clock, the engine's). Tests
// move it rather than sleep. Config has the one set of defaults and the
// validation of every RECOVERY_* setting (config.go).
package recovery
