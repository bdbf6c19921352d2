// Package external is what every call idemlab makes to another system has in
// common: the insurance provider (internal/provider) and the payments
// service (internal/payments) are two users of it.
//
// # Three outcomes, never confused
//
// A call to another system can end three ways:
//
//	Confirmed  the system answered that the effect is done
//	Rejected   the system refused for a business reason; nothing was applied
//	           and repeating the call will not change that
//	Unknown    no definite answer: a timeout, a reset or refused connection, a
//	           5xx, an answer that makes no sense, or "accepted, still
//	           running". The effect may or may not have been applied.
//
// Unknown is the zero Outcome, so a Result nobody filled in means "we do not
// know" — the only safe default. A timeout is missing information, not a
// failure: Send never turns one into Rejected.
//
// # The truth of a key
//
// Every mutating call carries an idempotency key chosen by the caller (one per
// step, the same for every retry of it). Asked about a key later, a system
// answers its Truth:
//
//	NOT_STARTED ──► RUNNING ──► COMPLETED
//	     │
//	     └────────► REJECTED
//
// Status never turns "could not ask" into NOT_STARTED: an answer it cannot
// read is an error wrapping ErrUnreachable, and a 404 counts as NOT_STARTED
// only when its body says so (a 404 from a wrong base URL is no information).
//
// # A deadline on every call
//
// A status answer describes the past, not the requests still in flight.
// NOT_STARTED means "no call with this key has arrived yet" — a call held in
// the network past the caller's timeout may still arrive and be applied. So
// every mutating call carries the latest moment it may still be applied, in
// the Request-Deadline header: the caller's clock plus the call's timeout, in
// RFC 3339 UTC with milliseconds. A system refuses, durably, a call that
// arrives after its deadline. Only once every earlier attempt's deadline has
// passed (plus a margin for clock skew) is NOT_STARTED conclusive.
//
// The caller learns the deadline before it sends (Client.Deadline), records it
// with its intent, then passes it in Call.Deadline; Result.Deadline reports the
// deadline the call carried either way. The client gives up at that same
// moment, so "the caller stopped waiting" and "the system stops accepting"
// are one instant on the caller's clock.
package external
