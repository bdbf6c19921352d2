package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
)

// Errors the store returns. Compare with errors.Is.
var (
	// ErrLeaseLost: the caller no longer owns the key (another request took it
	// over after the lease expired, or it was purged). The caller's transaction
	// must roll back: someone else executes, or has executed, the request.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrInProgress: another request holds the key under a live lease.
	ErrInProgress = errors.New("idempotency: request in progress")
	// ErrFingerprintMismatch: the key was first used for a different request.
	ErrFingerprintMismatch = errors.New("idempotency: key reused for a different request")
	// ErrNotFound: no row for this key (never used, released or purged).
	ErrNotFound = errors.New("idempotency: key not found")
)

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
	// now, when set, replaces the database's now() in every query (tests move
	// time with it instead of sleeping). nil means the database clock.
	now atomic.Pointer[time.Time]
}

// NewStore returns a store whose claims hold a lease of lease (how long an
// owner counts as alive) and whose keys are kept ttl after their last write
// (how long a completed response is replayed before the janitor may purge it).
func NewStore(pool *pgxpool.Pool, lease, ttl time.Duration) *Store {
	return &Store{pool: pool, lease: lease, ttl: ttl}
}

// clock is the $n argument every query passes to coalesce($n::timestamptz, now()).
func (s *Store) clock() *time.Time { return s.now.Load() }

// Claim is the right to execute one request: the key's current owner token.
// Handlers get it with ClaimFrom and finish it with Complete.
//
// A nil *Claim is valid: Complete and Release do nothing and return nil, so a
// handler works unchanged on a route without the middleware.
type Claim struct {
	UserID int64
	Key    string

	store *Store
	token [16]byte // owner_token: the fence every owner write carries

	// completed is the response Complete stored, nil until then. Only the
	// request's goroutine touches it.
	completed *Response
}

// Record is a key's row as Lookup reads it.
type Record struct {
	Fingerprint  []byte
	Status       string // StatusInProgress or StatusCompleted
	LeaseExpired bool   // IN_PROGRESS only: the owner looks dead
	Response     Response
	ExpiresAt    time.Time
}

// Claim inserts the key IN_PROGRESS with a fresh owner token and lease. It
// returns the *Claim when this caller now owns execution, and (nil, nil) when
// a row already exists: someone else owns, or owned, the key.
func (s *Store) Claim(ctx context.Context, userID int64, key string, fingerprint []byte) (*Claim, error) {
	c := &Claim{UserID: userID, Key: key, store: s}
	err := s.pool.QueryRow(ctx, `
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
		userID, key, fingerprint, s.clock(), s.lease, s.ttl,
	).Scan(&c.token)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim: %w", err)
	}
	return c, nil
}

// TakeOver makes the caller the owner of an IN_PROGRESS key whose lease has
// expired, for a retry of the same request only. The new owner token fences
// the old owner out: its Complete will find no row. It returns (nil, nil)
// when the key is not up for grabs (the owner is alive, the request completed,
// the fingerprint differs, or another retry took it over first).
func (s *Store) TakeOver(ctx context.Context, userID int64, key string, fingerprint []byte) (*Claim, error) {
	c := &Claim{UserID: userID, Key: key, store: s}
	// Two retries racing here both try the UPDATE: the second waits for the
	// first's row lock, re-checks the WHERE on the new row, and matches nothing.
	err := s.pool.QueryRow(ctx, `
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
		userID, key, fingerprint, s.clock(), s.lease, s.ttl,
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
		c.UserID, c.Key, c.token, resp.status(), header, body, s.clock(), s.ttl)
	if err != nil {
		return fmt.Errorf("idempotency: complete: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Release deletes the claim's key while it is still IN_PROGRESS and owned by
// the caller, so the next request with the key executes afresh. The middleware
// uses it for requests rejected before execution and for unexpected errors.
// It returns ErrLeaseLost when the caller no longer owns an IN_PROGRESS key
// (a completed key is never released). A nil claim returns nil.
func (s *Store) Release(ctx context.Context, c *Claim) error {
	if c == nil {
		return nil
	}
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM idempotency_keys
		 WHERE user_id = $1
		   AND idempotency_key = $2
		   -- the fence: only the current owner releases
		   AND owner_token = $3
		   -- never a completed key: its response must stay replayable
		   AND status = 'IN_PROGRESS'
		-- 0 rows: lease lost, or the key completed`,
		c.UserID, c.Key, c.token)
	if err != nil {
		return fmt.Errorf("idempotency: release: %w", err)
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
		       response_status,
		       response_headers,
		       response_body,
		       expires_at
		  FROM idempotency_keys,
		       (SELECT coalesce($3::timestamptz, now()) AS now) AS clock
		 WHERE user_id = $1
		   AND idempotency_key = $2`,
		userID, key, s.clock(),
	).Scan(&r.Fingerprint, &r.Status, &r.LeaseExpired, &status, &r.Response.Header, &r.Response.Body, &r.ExpiresAt)
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
		batch, s.clock())
	if err != nil {
		return 0, fmt.Errorf("idempotency: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Acquire runs the protocol's decision for one request, built from the
// statements above. It returns exactly one of:
//
//   - a *Claim: the caller executes the request (a first claim, or a take-over
//     from an owner whose lease expired);
//   - a completed *Record: the caller replays its Response;
//   - ErrInProgress: another request holds the key under a live lease;
//   - ErrFingerprintMismatch: the key belongs to a different request;
//   - another error: the database failed.
//
// Every path ends in a conditional write or a read of an immutable completed
// row, so any interleaving of concurrent calls leaves exactly one executor.
func (s *Store) Acquire(ctx context.Context, userID int64, key string, fingerprint []byte) (*Claim, *Record, error) {
	// Each extra round means the row changed hands between our statements
	// (released, purged or taken over); three rounds of that is contention
	// worth answering with "in progress, retry".
	for range 3 {
		claim, err := s.Claim(ctx, userID, key, fingerprint)
		if err != nil || claim != nil {
			return claim, nil, err
		}
		rec, err := s.Lookup(ctx, userID, key)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // released or purged since our INSERT: claim again
		case err != nil:
			return nil, nil, err
		case !bytes.Equal(rec.Fingerprint, fingerprint):
			return nil, nil, ErrFingerprintMismatch
		case rec.Status == StatusCompleted:
			return nil, rec, nil
		case !rec.LeaseExpired:
			return nil, nil, ErrInProgress
		}
		claim, err = s.TakeOver(ctx, userID, key, fingerprint)
		if err != nil || claim != nil {
			return claim, nil, err
		}
		// someone else took over or completed first: look again
	}
	return nil, nil, ErrInProgress
}

// Complete stores resp as the response of the claim's request, on tx (see
// Store.Complete). It returns ErrLeaseLost when the caller no longer owns the
// key: return it, so the transaction rolls back. A nil claim returns nil.
func (c *Claim) Complete(ctx context.Context, tx database.DBTX, resp Response) error {
	if c == nil {
		return nil
	}
	if err := c.store.Complete(ctx, tx, c, resp); err != nil {
		return err
	}
	c.completed = &resp
	return nil
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
