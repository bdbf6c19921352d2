// Package labs holds the labs: the classic mistakes of idempotency and
// recovery, each run next to its correction, on demand. Nothing teaches like
// watching the wrong version fail beside the right one.
//
// # What a lab is
//
// A lab is one scenario run twice (or a few times) — the broken variant,
// then the correct one — on the same data, with the same scheduled
// interleaving or crash point. Each variant reports numbers (executions,
// effects, duplicates, lost messages, refusals) and a timeline, and the lab
// names the lines of code that make the difference (Lab.Code).
//
//	Run (one transaction on the app's pool)
//	  hooks.Begin             the request's Idempotency-Key is claimed; a
//	                          double-click waits here, then replays
//	  scenario                broken variant, then correct one, on the labs
//	                          schema through a pool of its own, the lab's fake
//	                          systems, Redis — never a business table
//	  INSERT INTO labs.runs   the counts and timelines
//	  hooks.Finish            the answer, stored with the run
//	COMMIT
//
// The scenario runs while that one transaction is open, on other connections:
// the transaction holds nothing but the key's claim, so a duplicate of the
// request waits for the run to end and replays its answer (or is told 409
// request-in-progress when the run outlasts the claim's wait), and a run
// that fails or crashes leaves no result and no key — only scratch rows,
// which carry the run's id and are deleted when a run ends.
//
// # Rules every lab keeps
//
//   - Broken code lives only here, and says so in its name (brokenRedisStore,
//     brokenCheckThenInsertClaim, …). Nothing outside the package can reach
//     it; the web layer only asks to run a lab by name.
//   - Its own data: the labs schema (migrations/00040_labs.sql), whose
//     tables shared with the app have the app's exact shape so that the app's
//     own code (idempotency.Store, events.Handler, recovery.SetBelief) runs
//     on them unchanged, with search_path = labs. The fake systems are
//     built on internal/fault under system names of their own ('labs',
//     'labs-belief') with their state in labs.fake_requests and
//     labs.fake_effects, so a deliberate double effect never reaches the
//     ledgers the invariants read. The one exception is the timeout lab,
//     which is the real cancellation workflow: it cancels policies of its
//     own account (timeout-lab), which nobody can sign in as. The failover
//     lab keeps its keys and operations further away still: on a private
//     primary and standby (internal/pgcluster) that live as long as its run.
//   - Determinism: a broken variant breaks because of a crash point or a
//     scheduled interleaving — channels, a barrier, a call held in the
//     network by internal/netfault for a fixed time — never because of
//     luck. Its test proves it breaks, every time, and that the correct
//     variant does not.
//   - Bounded: a run's scratch rows are deleted when it ends; each user keeps
//     their newest runs of each lab (keptRuns).
package labs
