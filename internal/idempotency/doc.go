// Package idempotency makes a request safe to repeat: whatever the retries,
// double-clicks, crashes and races, it executes at most once per key and every
// repeat gets the first answer back, byte for byte.
//
// It implements the IETF Idempotency-Key HTTP header draft on PostgreSQL, in
// the table idempotency_keys (migrations/00002_idempotency_keys.sql), as three
// moves — claim, lease, complete:
//
//   - Claim: INSERT … ON CONFLICT DO NOTHING RETURNING. The unique (user_id,
//     idempotency_key) decides who executes: one row back means "mine".
//   - Lease: the owner holds the key until lease_expires_at (database clock).
//     Only after that may a retry of the same request TakeOver, with a new
//     owner token; a live owner is never disturbed.
//   - Complete: UPDATE … WHERE owner_token = mine AND status = 'IN_PROGRESS',
//     inside the transaction that makes the request's business writes, so
//     both commit or neither does. Zero rows is ErrLeaseLost: a newer owner
//     exists, and the caller rolls back.
//
// # A key's life
//
//	             Claim: INSERT, new owner token
//	absent ─────────────────────────────────────▶ IN_PROGRESS(owner token, lease)
//	  ▲ ◀─────────────────────────────────────────  │  ▲   │
//	  │   Release: by the owner, before a           │  └───┘ TakeOver: lease expired,
//	  │   response is stored                        │        same fingerprint → new token
//	  │                                             │ Complete: owner token matches,
//	  │                                             ▼ inside the business transaction
//	  └───── Purge: expires_at passed ─────── COMPLETED(response): replayed, never changes
//
// Purge also removes an abandoned IN_PROGRESS key once both its lease and its
// retention have passed.
//
// A crashed or panicking owner leaves the key IN_PROGRESS; duplicates get 409
// until the lease expires, then the next retry takes over.
//
// # Invariants
//
//  1. At most one owner token is current per key; every owner write
//     (Complete, Release) names it, so a stale owner changes nothing.
//  2. A key's business writes commit only together with its COMPLETED mark
//     (handlers Complete inside their transaction), so at most one execution
//     commits per key.
//  3. A COMPLETED row never changes until it is purged: every replay is the
//     same status, headers and body.
//  4. Keys are per user: one user can never reach another's stored response.
//  5. A key under a live lease is never taken over nor purged.
//  6. Lease and expiry decisions use the database clock, never the app's.
//
// The middleware (Middleware) is the HTTP protocol around the store; the
// janitor (Janitor) purges expired keys. docs/idempotency.md walks through
// the protocol with sequence diagrams and answers the draft's open questions.
package idempotency
