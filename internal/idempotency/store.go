package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
)

// Errors the store returns. Compare with errors.Is.
var (
	// ErrLeaseLost: the caller no longer owns the key (another request took it
	// over after the lease expired, or it was purged). The caller's transaction
	// must roll back: someone else executes, or has executed, the request.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrInProgress: another request holds the key under a live lease, or
	// its first transaction did not end within the claim's wait.
	ErrInProgress = errors.New("idempotency: request in progress")
	// ErrAlreadyClaimed: the key exists and is not the caller's to take —
	// another request completed it, or holds it under a live lease. The
	// workflow's transaction rolls back, and the middleware answers from the
	// store (a replay, or 409 request-in-progress).
	ErrAlreadyClaimed = errors.New("idempotency: key already claimed")
	// ErrFingerprintMismatch: the key was first used for a different request.
	ErrFingerprintMismatch = errors.New("idempotency: key reused for a different request")
	// ErrNotFound: no row for this key (never used, released or purged).
	ErrNotFound = errors.New("idempotency: key not found")
)

// The middleware's refusals before any work, as *Refusal. With
// ErrFingerprintMismatch (a key reused) and ErrInProgress (its request still
// runs) they are every "no" of the protocol; the app's error table gives
// each its answer.
var (
	ErrNotSignedIn    = errors.New("idempotency: not signed in")
	ErrKeyMissing     = errors.New("idempotency: key missing")
	ErrKeyMalformed   = errors.New("idempotency: key malformed")
	ErrBodyUnreadable = errors.New("idempotency: request body unreadable")
	ErrBodyTooLarge   = errors.New("idempotency: request body too large")
)

// Refusal is one refusal of the protocol: Err says which (errors.Is finds
// it), Detail what the client should do about it, in words for people.
type Refusal struct {
	Err    error
	Detail string
}

func (r *Refusal) Error() string { return r.Detail }
func (r *Refusal) Unwrap() error { return r.Err }

// Key statuses, as stored in idempotency_keys.status.
const (
	StatusInProgress = "IN_PROGRESS"
	StatusCompleted  = "COMPLETED"
)

// Store keeps idempotency keys in PostgreSQL. Every method is one SQL
// statement; all times come from the database clock.
type Store struct {
	pool  *pgxpool.Pool
	lease time.Duration
	ttl   time.Duration
	// claimWait bounds how long a claim waits for a concurrent duplicate's
	// open transaction (lock_timeout on the INSERT); past it the duplicate
	// is answered 409 request-in-progress.
	claimWait time.Duration
	// clock is the $n of every query's coalesce($n::timestamptz, now()):
	// the database's now() unless a test moves it (instead of sleeping).
	clock database.Clock
}

// NewStore returns a store whose claims hold a lease of lease (how long an
// owner counts as alive) and whose keys are kept ttl after their last write
// (how long a completed response is replayed before the janitor may purge it).
func NewStore(pool *pgxpool.Pool, lease, ttl time.Duration) *Store {
	return &Store{pool: pool, lease: lease, ttl: ttl, claimWait: DefaultClaimWait}
}

// DefaultClaimWait is how long a duplicate waits for the original's first
// transaction before it is told the request is in progress. The original's
// first transaction holds no network call, so it normally ends within
// milliseconds; the bound is for an original stuck on a lock.
const DefaultClaimWait = 2 * time.Second

// Claim is the right to execute one request: the key's current owner token.
// The workflow gets it from Attempt.Claim in its first transaction and
// finishes it with Complete in the transaction that stores the answer.
//
// A nil *Claim is valid: Complete does nothing and returns nil, so a
// workflow runs unchanged without a request key (the recovery loop, tests).
type Claim struct {
	UserID int64
	Key    string

	store *Store
	token [16]byte // owner_token: the fence every owner write carries
}

// Record is a key's row as Lookup reads it.
type Record struct {
	Fingerprint  []byte
	Status       string // StatusInProgress or StatusCompleted
	LeaseExpired bool   // IN_PROGRESS only: the owner looks dead
	// LeaseExpiresAt is when the owner's lease runs out (IN_PROGRESS): a
	// retry may take the key over after it.
	LeaseExpiresAt time.Time
	Response       Response
	ExpiresAt      time.Time
}

// Claim inserts the key IN_PROGRESS with a fresh owner token and lease, on
// tx — the workflow's first transaction, so the claim commits with the
// request's first business writes or not at all. It returns the *Claim when
// this caller now owns execution, and (nil, nil) when a row already exists:
// someone else owns, or owned, the key.
//
// A duplicate whose original is still inside its first transaction waits
// here on the unique index until that transaction ends (then it sees the
// committed row, or none if it rolled back) — at most claimWait, after which
// it gets ErrInProgress.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, userID int64, key string, fingerprint []byte) (*Claim, error) {
	c := &Claim{UserID: userID, Key: key, store: s}
	// One round trip: bound the wait, claim, lift the bound for the rest of
	// the workflow's transaction.
	batch := &pgx.Batch{}
	batch.Queue(`SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(s.claimWait.Milliseconds(), 10))
	claimed := batch.Queue(`
		INSERT INTO idempotency_keys (
		    user_id, idempotency_key, request_fingerprint,
		    status, owner_token, lease_expires_at,
		    created_at, expires_at)
		SELECT $1, $2, $3,
		       'IN_PROGRESS', gen_random_uuid(), clock.now + $5::interval,
		       clock.now, clock.now + $6::interval
		  FROM (SELECT coalesce($4::timestamptz, now()) AS now) AS clock
		-- 0 rows: the key exists, someone else owns or owned it
		ON CONFLICT (user_id, idempotency_key) DO NOTHING
		RETURNING owner_token`,
		userID, key, fingerprint, s.clock.Arg(), s.lease, s.ttl)
	var mine bool
	claimed.QueryRow(func(row pgx.Row) error {
		err := row.Scan(&c.token)
		mine = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	batch.Queue(`SET LOCAL lock_timeout TO DEFAULT`)
	err := tx.SendBatch(ctx, batch).Close()
	var pgErr *pgconn.PgError
	// 55P03 lock_not_available: the original's transaction outlasted claimWait.
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return nil, ErrInProgress
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim: %w", err)
	}
	if !mine {
		return nil, nil
	}
	return c, nil
}

// TakeOver makes the caller the owner of an IN_PROGRESS key whose lease has
// expired, for a retry of the same request only, on tx (the retry's first
// transaction, like Claim). The new owner token fences
// the old owner out: its Complete will find no row. It returns (nil, nil)
// when the key is not up for grabs (the owner is alive, the request completed,
// the fingerprint differs, or another retry took it over first).
func (s *Store) TakeOver(ctx context.Context, tx pgx.Tx, userID int64, key string, fingerprint []byte) (*Claim, error) {
	c := &Claim{UserID: userID, Key: key, store: s}
	// Two retries racing here both try the UPDATE: the second waits for the
	// first's row lock, re-checks the WHERE on the new row, and matches nothing.
	err := tx.QueryRow(ctx, `
		UPDATE idempotency_keys
		   SET owner_token = gen_random_uuid(),
		       lease_expires_at = clock.now + $5::interval,
		       expires_at = clock.now + $6::interval
		  FROM (SELECT coalesce($4::timestamptz, now()) AS now) AS clock
		 WHERE user_id = $1
		   AND idempotency_key = $2
		   -- only a retry of the same request may take over
		   AND request_fingerprint = $3
		   AND status = 'IN_PROGRESS'
		   -- only from an owner that looks dead
		   AND lease_expires_at < clock.now
		-- 0 rows: the owner is alive, it completed, or someone else took over first
		RETURNING owner_token`,
		userID, key, fingerprint, s.clock.Arg(), s.lease, s.ttl,
	).Scan(&c.token)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: take over: %w", err)
	}
	return c, nil
}

// Complete marks the claim's key COMPLETED with resp as its stored response,
// on tx: run it inside the transaction that makes the request's business
// writes, so both commit or neither does. The key's retention restarts now.
//
// It returns ErrLeaseLost when the caller no longer owns the key; the caller
// must then roll its transaction back, because another request executes (or
// executed) in its place. A nil claim returns nil.
func (s *Store) Complete(ctx context.Context, tx database.DBTX, c *Claim, resp Response) error {
	if c == nil {
		return nil
	}
	header := resp.Header
	if header == nil {
		header = http.Header{}
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	tag, err := tx.Exec(ctx, `
		UPDATE idempotency_keys
		   SET status = 'COMPLETED',
		       response_status = $4,
		       response_headers = $5,
		       response_body = $6,
		       completed_at = clock.now,
		       expires_at = clock.now + $8::interval
		  FROM (SELECT coalesce($7::timestamptz, now()) AS now) AS clock
		 WHERE user_id = $1
		   AND idempotency_key = $2
		   -- the fence: only the current owner completes
		   AND owner_token = $3
		   AND status = 'IN_PROGRESS'
		-- 0 rows: lease lost (taken over or purged): the caller rolls back`,
		c.UserID, c.Key, c.token, resp.status(), header, body, s.clock.Arg(), s.ttl)
	if err != nil {
		return fmt.Errorf("idempotency: complete: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost
	}
	return nil
}

// EndLease ends the claim's lease now, while the key is still IN_PROGRESS
// and owned by the caller: a retry may take it over at once instead of
// waiting for the lease to run out. The middleware calls it when a workflow
// failed after its first commit (a cancellation whose outcome could not be
// recorded). It returns ErrLeaseLost when the caller does not own an
// IN_PROGRESS key — in particular when the claim never committed. A nil
// claim returns nil.
func (s *Store) EndLease(ctx context.Context, c *Claim) error {
	if c == nil {
		return nil
	}
	tag, err := s.pool.Exec(ctx, `
		UPDATE idempotency_keys
		   -- never later than it was: now() is the transaction's start, so
		   -- ending an already ended lease again must not move it past the
		   -- now() of a take-over that began a moment earlier
		   SET lease_expires_at = least(lease_expires_at, coalesce($4::timestamptz, now()))
		 WHERE user_id = $1
		   AND idempotency_key = $2
		   -- the fence: only the current owner gives its lease up
		   AND owner_token = $3
		   AND status = 'IN_PROGRESS'
		-- 0 rows: lease lost, the key completed, or the claim rolled back`,
		c.UserID, c.Key, c.token, s.clock.Arg())
	if err != nil {
		return fmt.Errorf("idempotency: end lease: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Lookup reads the key's row. It takes no lock: whatever the caller decides
// from it ends in a conditional write (Claim, TakeOver) that re-checks the
// row, or in a replay of a completed response, which never changes.
// It returns ErrNotFound when there is no row.
func (s *Store) Lookup(ctx context.Context, userID int64, key string) (*Record, error) {
	var (
		r      Record
		status *int
	)
	err := s.pool.QueryRow(ctx, `
		SELECT request_fingerprint,
		       status,
		       lease_expires_at < clock.now,
		       lease_expires_at,
		       response_status,
		       response_headers,
		       response_body,
		       expires_at
		  FROM idempotency_keys,
		       (SELECT coalesce($3::timestamptz, now()) AS now) AS clock
		 WHERE user_id = $1
		   AND idempotency_key = $2`,
		userID, key, s.clock.Arg(),
	).Scan(&r.Fingerprint, &r.Status, &r.LeaseExpired, &r.LeaseExpiresAt, &status, &r.Response.Header, &r.Response.Body, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: lookup: %w", err)
	}
	if status != nil {
		r.Response.Status = *status
	}
	return &r, nil
}

// Purge deletes up to batch keys whose retention has passed and returns how
// many it deleted. A key under a live lease is never purged, whatever the
// configured TTL, and rows another transaction holds (a Complete about to
// commit, another replica's janitor) are skipped rather than waited for.
func (s *Store) Purge(ctx context.Context, batch int) (int, error) {
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM idempotency_keys
		 WHERE (user_id, idempotency_key) IN (
		        SELECT user_id, idempotency_key
		          FROM idempotency_keys,
		               (SELECT coalesce($2::timestamptz, now()) AS now) AS clock
		         WHERE expires_at < clock.now
		           -- never under a live lease: its owner may still complete
		           AND (status = 'COMPLETED' OR lease_expires_at < clock.now)
		         ORDER BY expires_at
		         LIMIT $1
		           -- skip rows someone holds: two janitors never wait on each other
		           FOR UPDATE SKIP LOCKED)`,
		batch, s.clock.Arg())
	if err != nil {
		return 0, fmt.Errorf("idempotency: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Complete stores resp as the response of the claim's request, on tx (see
// Store.Complete). It returns ErrLeaseLost when the caller no longer owns the
// key: return it, so the transaction rolls back. A nil claim returns nil.
func (c *Claim) Complete(ctx context.Context, tx database.DBTX, resp Response) error {
	if c == nil {
		return nil
	}
	return c.store.Complete(ctx, tx, c, resp)
}

// Response is what a completed key replays: status, the headers that matter
// (Content-Type, Location) and the body, byte for byte.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSONResponse encodes v as a JSON response with the given status. It returns
// an error only when v cannot be encoded as JSON.
func JSONResponse(status int, v any) (Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return Response{}, fmt.Errorf("idempotency: encode response: %w", err)
	}
	return Response{
		Status: status,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   append(body, '\n'),
	}, nil
}

// RedirectResponse is a redirect to location, typically 303 See Other after a
// form POST: a replayed form submission then redirects again (POST/redirect/GET).
func RedirectResponse(status int, location string) Response {
	return Response{Status: status, Header: http.Header{"Location": {location}}, Body: []byte{}}
}

func (r Response) status() int {
	if r.Status == 0 {
		return http.StatusOK
	}
	return r.Status
}
