// Package fake is a stand-in for Google Cloud Tasks: an HTTP service with
// its own API (Cloud Tasks' v2 REST shape, internal/tasks), its own durable
// state (the fake_tasks schema) and its own dispatchers, which push each
// task to the URL it names until a push is answered 2xx. It is to package
// tasks what internal/provider/fake is to package provider; it shares the
// fakes' control-API access rule and JSON helpers (internal/fault).
//
// # A task's life
//
//	create ──► PENDING ──push answered 2xx──────────────────► SUCCEEDED
//	             │  ▲
//	   non-2xx,  │  │ backoff: MinBackoff doubling, at most MaxBackoff
//	   no answer │  │
//	   in the    ▼  │
//	   deadline  retry ──MaxAttempts pushes──────────────────► FAILED (dropped)
//
// Each push carries the task's own request and headers plus Cloud Tasks'
// X-CloudTasks-QueueName, -TaskName, -TaskRetryCount (0 on the first push),
// -TaskExecutionCount (earlier pushes that got an answer), -TaskETA and,
// on a retry, -TaskPreviousResponse. A push not answered within the task's
// dispatch deadline counts as failed, even if the handler committed its
// work: the queue cannot tell, so it pushes again. That is the contract —
// at least once — and the handler's to absorb.
//
// # The creation dedupe
//
// A name is taken while its task is PENDING and for DedupeWindow after it
// finished (Cloud Tasks: about an hour after the task ran or was deleted):
// a create in that time is answered 409 ALREADY_EXISTS and changes
// nothing. After the window the same name creates a new task, which is
// pushed again in full — the name dedupes creations for a while, never
// deliveries, and never for ever. fake_tasks.names holds the rule: its
// primary key makes two concurrent creates of a name wait for each other,
// and its INSERT … ON CONFLICT DO UPDATE … WHERE takes the name over only
// once the window has passed.
//
// # Several queue instances
//
// Every Queue on one database is one queue. A dispatcher claims due tasks
// with FOR UPDATE SKIP LOCKED and leases each for its dispatch deadline
// plus LeaseMargin (schedule_time pushed forward, a claim token set); its
// result is recorded only while that token is still the task's. So two
// instances never push one task at once — except by design, when an
// instance dies (or stalls) mid-push: the lease runs out, another instance
// pushes the task again, and the late result of the first is fenced off.
//
// # Invariants the package keeps
//
//   - At most one task holds a name at a time, and a name is refused for
//     DedupeWindow after its task finished.
//   - A task is SUCCEEDED only after a push was answered 2xx; it is pushed
//     until then or until MaxAttempts pushes.
//   - A push's result changes the task only under the claim that made it.
package fake
