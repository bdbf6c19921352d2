// Package policies owns insurance policies and their cancellation.
//
// A cancellation is a workflow of steps, run by internal/workflow:
//
//	record_intent → provider_cancel → mark_cancelled + publish_event → refund → audit
//	   (local)      (the provider)        (local, one transaction)    (payments)  (local)
//
// cancel.go is the definition and record_intent (the business identity:
// one cancellation per policy); steps.go is what each step does — the two
// calls, the policy CANCELLED, the policy.cancelled event in the outbox,
// the refund of the unused premium prorated to the day, the audit line;
// policies.go is what the pages read. The engine decides when each runs and
// records it; a person's decisions and the recovery loop's live there too.
//
// # The operation's states
//
//	                    record_intent (tx 1)
//	                           │
//	                           ▼
//	┌──────────────────── IN_PROGRESS ──────────── an outcome unknown: handed over
//	│ provider refused          │ every step done      (lease ended on purpose)
//	▼                           ▼                              │
//	FAILED                  SUCCEEDED           claim (new owner token) ▼
//	(run it again:             ▲               RECOVERING ── poll · back off
//	 next run, new keys)       │                   │   └── resume at the first step not DONE
//	                           └───────────────────┤
//	                                               ├── provider REJECTED → FAILED
//	                                               └── unknown after its attempts,
//	                                                   or the refund refused → NEEDS_RECONCILIATION
//	                                                        │ asked again now and then: a known truth →
//	                                                        │ RECOVERING (recovery finishes it)
//	                                                        └ a person: mark done · retry · mark failed
//
// A refused provider call fails the cancellation cleanly (nothing was done
// elsewhere) and the policy may be cancelled again, under new step keys. A
// refused refund cannot undo the cancellation: the policy stays CANCELLED
// and a person decides.
//
// # Invariants (with internal/workflow and internal/invariants)
//
//  1. One cancellation per policy, whatever the request keys:
//     UNIQUE(policy_id, operation_type).
//  2. A policy is CANCELLED exactly when its cancellation's mark_cancelled
//     is DONE, which follows the provider's COMPLETED for provider_cancel's
//     key, in the same transaction as the policy.cancelled event.
//  3. A refund only for a cancelled policy, at most one per policy: its key
//     is the refund step's, its amount computed once and resent verbatim.
package policies
