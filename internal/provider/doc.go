// Package provider is idemlab's client for the external insurance provider
// that carries out policy cancellations.
//
// A call to another system can end three ways, and the caller must never
// confuse them:
//
//	Confirmed  the provider answered that the cancellation is done
//	Rejected   the provider answered that it refuses, for a business reason;
//	           nothing was applied and repeating the call will not change that
//	Unknown    no definite answer: a timeout, a reset or refused connection, a
//	           5xx, or "accepted, still running". The cancellation may or may
//	           not have been applied. The caller keeps its operation
//	           IN_PROGRESS and later asks Status for the truth.
//
// A timeout is missing information, not a failure: Cancel never turns one into
// Rejected, and Status never turns "could not ask" into NOT_STARTED. When the
// truth cannot be learned right now, Status returns an error wrapping
// ErrUnreachable and the caller tries again later.
//
// Every call carries a provider idempotency key chosen by the caller (one per
// step, reused by every retry of it), so a provider that honours keys turns a
// retry after Unknown into the same single effect. Every call also carries a
// deadline (Request-Deadline: the caller's clock plus PROVIDER_TIMEOUT) after
// which the provider refuses it, so NOT_STARTED becomes conclusive once the
// deadlines of all earlier calls have passed. A caller that records the
// deadline before sending takes it from Deadline and passes it in
// CancelRequest.Deadline; Result.Deadline is the one the call carried.
//
// The vocabulary (Outcome, Truth, Result, ErrUnreachable, StatusError) and the
// HTTP mechanics are internal/external's, shared with every other system's
// client; this package names them so its callers read provider.Result.
//
// HTTPClient is the implementation over the provider's HTTP API; the fake in
// internal/provider/fake serves that API with every failure on demand, the way
// net/http/httptest serves net/http.
package provider
