// Package workflow holds what every idemlab workflow shares: the hooks that
// tie a workflow's transactions to the request that runs it (hooks.go), and
// the step engine for work that spans more than one system — the database,
// events, and external APIs that each keep their own truth.
//
// # When one key is not enough
//
// A request's Idempotency-Key says whether the request ran. A cancellation
// that cancels at the provider, cancels locally, publishes an event and
// refunds at the payments service has done several things, at several
// systems, and a crash can stop it between any two. So each step keeps its
// own state, durable on the operation (table operation_steps), and each
// external call carries a key of its own, derived from the operation and the
// step: StepKey.
//
// # A step's states
//
//	PENDING ──► SENT ──► DONE
//	   │          │  └──► FAILED     (a definite refusal)
//	   │          └─────► UNKNOWN    (no answer, a timeout, a 5xx, RUNNING)
//	   │                     └──────► SENT again (same key) · DONE · FAILED
//	   └──► DONE                     (a local step, or nothing to send)
//
// PENDING: not reached. SENT: the call is recorded — its request, its
// deadline, one more attempt — before it is made, so a crash after the call
// leaves evidence that it may have happened. DONE and FAILED: the outcome is
// known. UNKNOWN: a call was made and nobody knows what it did; it is not a
// failure. Local steps never need SENT or UNKNOWN: they write in the
// transaction of their neighbours, and a crash rolls them back with it.
//
// # Who writes
//
// The operation's owner — the request that started it, or the recovery
// worker that claimed it — and only while it holds the owner token. Every
// step write touches the operation row as its owner in the same statement
// (a data-modifying CTE), so a writer whose token was replaced changes zero
// rows (ErrLeaseLost: counted in idemlab_workflow_fenced_writes_total and
// written on the timeline), and a claim running at the same moment waits on
// the row lock of that write. A person deciding an operation waiting for
// them becomes its owner for that one transaction.
//
// # The transactions of a run
//
// The engine opens one transaction before the first external step and one
// after each: local steps join whichever is open. For the cancellation:
//
//	tx 1  Begin · record_intent · provider_cancel SENT
//	      provider_cancel  (the provider's own commit)
//	tx 2  provider_cancel DONE · mark_cancelled · publish_event · refund SENT
//	      refund           (the payments service's own commit)
//	tx 3  refund DONE · audit · SUCCEEDED · Finish
//
// One commit for the intent, and exactly two more per external step.
//
// # Recovery
//
// The engine is also the recovery loop's one Claimer and Recoverer, for
// every kind of operation (recover.go): it resumes a claimed operation at
// its first step not DONE, and for an external step asks its system for the
// truth of the step's key before anything else. The deadline rule: a status
// answer describes the past, not the requests still in flight — NOT_STARTED
// is conclusive only once every earlier attempt's deadline (plus a margin
// for clock skew) has passed. docs/workflows.md and docs/recovery.md tell it
// in full.
//
// # What the pages see, and nothing more
//
// The engine runs steps and fences writes; it does not know the pages that
// show it at work. They see it through two small, explicit doors:
//
//   - The timeline (operation_timeline: a row per commit, its lines in
//     order; the view operation_events reads it a line a row), written by
//     the engine (timeline.go) at the end of the transaction that made each
//     transition — who, from and to, the step, the recovery branch, a
//     detail a person can decide by — names the statement behind the
//     transition ("workflow.sqlStepSent", the constant that holds it:
//     statements.go) and never copies its text or values. Statement
//     resolves a name to its text; the page finds its line in the embedded
//     source (idemlab.DeclLine).
//   - Crash points (Config.Crash): a run passes a named point before and
//     after each step; a lab or a test arms one and the process dies
//     there. Unarmed — always, in production — a pass is one atomic load.
//
// Delete both and the engine builds, runs and recovers the same.
//
// # The surface other packages build on
//
//	Engine.Register(Definition)       a workflow: its steps, local (Do) or external (Call)
//	Engine.Start(…, StartFunc, Hooks)  a request runs a new operation (start.go)
//	Engine.ClaimStale, Engine.Recover  the recovery loop's Claimer and Recoverer (claim.go, recover.go)
//	Engine.RequestCancel               a person's cancel: a mark the owner stops at (cancel.go)
//	Engine.Decide(…, func(*Person))    a person's decision, in the caller's transaction: its
//	                                   fenced writes (decide.go); which fits is the desk's
//	Engine.RetryFrom(…, check)         a new run from a step (retry.go); the rule is
//	                                   internal/operations'
//	Engine.Callback                    a system tells a truth instead of being asked (callback.go)
//	Restart, ScanOperation, StepKey    for start functions (operation.go)
//
// # Invariants the package keeps
//
//  1. A step's call carries StepKey(operation, step, run): the same key on
//     every retry, after a crash, after a restart, by any worker.
//  2. An external step is SENT, with its deadline, in a commit before its
//     call; DONE or FAILED only once its outcome is known.
//  3. Steps are done in order: a step is reached only when every earlier
//     one of its run is DONE.
//  4. Every write by an owner is fenced by its token; a refused one leaves
//     nothing but its line on the timeline.
//  5. Recovery never repeats a call whose outcome is unknown on a system
//     the app does not believe idempotent (external_systems), and treats
//     NOT_STARTED as conclusive only after the deadline rule.
package workflow
