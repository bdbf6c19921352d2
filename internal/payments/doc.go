// Package payments is idemlab's client for the payments service that takes
// deposits and pays refunds: the second external system, next to the
// insurance provider (internal/provider).
//
// Every call is classified exactly like the provider's (internal/external):
// Confirmed, Rejected (a business refusal: declined, nothing to refund) or
// Unknown (a timeout, a reset, a 5xx, "still running", a call refused for
// arriving after its deadline) — Unknown is never turned into anything
// else. Every call carries an idempotency key chosen by the caller (the step
// key, the same for every retry) and a Request-Deadline; the truth of a key
// is asked with ChargeStatus or RefundStatus, and NOT_STARTED is conclusive
// only once every deadline sent with the key has passed.
//
//	Charge   POST /v1/charges   {"policy_id" or "booking_id", "amount_cents", "description"}
//	Refund   POST /v1/refunds   {"charge_key" or "policy_id", "amount_cents", "reason"}
//	status   GET  /v1/charges/{key}, GET /v1/refunds/{key}
//
// A refund names what it gives money back for: a charge (by the charge's
// key, as the deposit saga does) or a policy whose premium was paid outside
// this service (as a cancellation does). The fake in internal/payments/fake
// serves this API with every fault of internal/fault.
package payments
