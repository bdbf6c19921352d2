// Package idempotency makes a request safe to repeat: whatever the retries,
// double-clicks, crashes and races, it executes at most once per key and every
// repeat gets the first answer back, byte for byte.
//
// It implements the IETF Idempotency-Key HTTP header draft on PostgreSQL, in
// the table idempotency_keys (migrations/00002_idempotency_keys.sql), as three
// moves — claim, lease, complete — made inside the workflow's own
// transactions:
//
//   - Claim: INSERT … ON CONFLICT DO NOTHING RETURNING, as the first
//     statement of the workflow's first transaction (Attempt.Claim). The
//     unique (user_id, idempotency_key) decides who executes: one row back
//     means "mine". A duplicate arriving while that transaction is open waits
//     on the index (bounded), then sees the committed row — or none, if the
//     original crashed before committing, and then it executes itself.
//   - Lease: a claim that commits before the work is done (the work calls
//     another system between two transactions) is held until
//     lease_expires_at (database clock). Only after that may a retry of the
//     same request TakeOver, with a new owner token.
//   - Complete: UPDATE … WHERE owner_token = mine AND status = 'IN_PROGRESS',
//     inside the transaction that decides the request's answer, so the
//     outcome and the stored answer commit together. Zero rows is
//     ErrLeaseLost: a newer owner exists, and the caller rolls back.
//
// Work that stays in PostgreSQL therefore commits once — claim, business
// writes, answer — and never leaves an IN_PROGRESS key behind.
//
// # A key's life
//
//	              Claim: INSERT in the workflow's first transaction
//	absent ─────────────────────────────────────────────▶ IN_PROGRESS(owner token, lease)
//	  │  (a one-transaction workflow completes in the            │  ▲   │
//	  │   same commit: absent → COMPLETED directly)              │  └───┘ TakeOver: lease expired (or
//	  │                                                          │        ended by EndLease), same
//	  │                                                          │        fingerprint → new token
//	  │                                 Complete: owner token matches,
//	  │                                 inside the transaction deciding the answer
//	  │                                                          ▼
//	  └─────────── Purge: expires_at passed ─────────── COMPLETED(response): replayed, never changes
//
// Purge also removes an abandoned IN_PROGRESS key once both its lease and its
// retention have passed.
//
// A crashed or panicking owner whose claim had committed leaves the key
// IN_PROGRESS; duplicates get 409 until the lease expires, then the next
// retry takes over. An owner that fails without crashing ends its lease at
// once (EndLease), so the retry need not wait.
//
// # Invariants
//
//  1. At most one owner token is current per key; every owner write
//     (Complete, EndLease) names it, so a stale owner changes nothing.
//  2. A key's first business writes commit only together with its claim, and
//     its outcome only together with its COMPLETED mark, so at most one
//     execution commits per key.
//  3. A COMPLETED row never changes until it is purged: every replay is the
//     same status, headers and body.
//  4. Keys are per user: one user can never reach another's stored response.
//  5. A key under a live lease is never taken over nor purged.
//  6. Lease and expiry decisions use the database clock, never the app's.
//  7. An attempt that lost its key answers nothing of its own: it replays the
//     key's stored answer, or answers 409 request-in-progress (never stored).
//
// The middleware (Middleware) is the HTTP protocol around the store; the
// janitor (Janitor) purges expired keys. docs/idempotency.md walks through
// the protocol with sequence diagrams and answers the draft's open questions.
package idempotency
