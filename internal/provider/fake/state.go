package fake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider"
)

// This file is the provider's durable state: every SQL statement it runs.
// Each exported method is one transaction.

// requests is the provider's table of key records; webhooks its outbox of
// callbacks.
var (
	requests = fault.NewTable("fake_provider", "requests")
	webhooks = fault.NewOutbox("fake_provider", "provider")
)

// call is one cancellation call the provider processes. Its methods are the
// provider's half of fault.Keyed: the SQL on the provider's own tables.
type call struct {
	key      string
	policyID int64
	reason   string
	fault    fault.Call
}

var _ fault.Keyed = call{}

// Accepted reports whether the call's mode carries out the cancellation
// (now, or after slow_ms); reject refuses it.
func (c call) Accepted() bool { return c.fault.Accepted() }

// completesIn is how long after receipt an accepted call completes.
func (c call) completesIn() time.Duration { return c.fault.CompletesIn() }

// request is the provider's record of a key, with its truth computed at read time.
type request struct {
	Key          string
	PolicyID     int64
	Truth        provider.Truth
	RejectReason string
	Attempts     int
	ReceivedAt   time.Time
	CompletesAt  time.Time
	// untilComplete is how long a RUNNING request still has to go (0 otherwise).
	untilComplete time.Duration
}

const rejectReason = "the provider refuses to cancel this policy (fault mode reject)"

// receive processes one call in one transaction (fault.Process: the
// idempotency switch) and returns the key's record afterwards.
func (p *Provider) receive(ctx context.Context, c call) (request, error) {
	var rec request
	err := pgx.BeginTxFunc(ctx, p.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := fault.Process(ctx, tx, c.fault, fault.Policy(c.policyID), c); err != nil {
			return err // a reused key rolls back the attempt count too
		}
		var err error
		rec, err = readRequest(ctx, tx, c.key, nil)
		return err
	})
	if err != nil {
		return request{}, fmt.Errorf("fake: receive %s: %w", c.key, err)
	}
	return rec, nil
}

// InsertFirst records the first call with a key and reports whether this
// call was it.
func (c call) InsertFirst(ctx context.Context, tx pgx.Tx) (bool, error) {
	outcome, reason := "ACCEPTED", (*string)(nil)
	if !c.Accepted() {
		outcome, reason = "REJECTED", new(rejectReason)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO fake_provider.requests (idempotency_key, policy_id, reason, outcome, reject_reason, completes_at)
		VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 millisecond')
		-- the key is known (or a concurrent first call holds it; we wait for it): a repeat
		ON CONFLICT (idempotency_key) DO NOTHING`,
		c.key, c.policyID, c.reason, outcome, reason, c.completesIn().Milliseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// CountRepeat counts a repeat and returns the policy the key belongs to.
func (c call) CountRepeat(ctx context.Context, tx pgx.Tx) (fault.Subject, error) {
	var policyID int64
	err := requests.CountRepeat(ctx, tx, c.key, "policy_id", &policyID)
	return fault.Policy(policyID), err
}

// AcceptAgain: see fault.Table.AcceptAgain.
func (c call) AcceptAgain(ctx context.Context, tx pgx.Tx) error {
	return requests.AcceptAgain(ctx, tx, c.key, c.completesIn())
}

// Notify queues the callbacks of the key's outcome.
func (c call) Notify(ctx context.Context, tx pgx.Tx) error {
	return webhooks.Notify(ctx, tx, requests, c.key)
}

// ApplyEffect writes one row to the effects ledger: the cancellation itself.
// A slow call's effect is written at acceptance with applied_at in the
// future, so it is durable at once and counts from its completion on; the
// ledger thus never needs a background process either.
func (c call) ApplyEffect(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
		VALUES ($1, $2, now() + $3 * interval '1 millisecond')`,
		c.key, c.policyID, c.completesIn().Milliseconds())
	return err
}

// record is r as the caller is answered.
func (r request) record() fault.Record {
	return fault.Record{Key: r.Key, Truth: r.Truth, Reason: r.RejectReason, UntilComplete: r.untilComplete}
}

// readRequest returns the record of key as of at (nil: the database clock
// when the statement starts — not now(), the transaction's start: a repeat
// that waited for the first call's commit began before that call's now()
// and would see a completed key still RUNNING).
// pgx.ErrNoRows means the provider never processed the key: NOT_STARTED.
func readRequest(ctx context.Context, db database.DBTX, key string, at *time.Time) (request, error) {
	var r request
	var reason *string
	var untilMS float64
	err := db.QueryRow(ctx, `
		SELECT idempotency_key,
		       policy_id,
		       fake_provider.truth(outcome, completes_at, coalesce($2::timestamptz, statement_timestamp())),
		       reject_reason,
		       attempts,
		       received_at,
		       completes_at,
		       extract(epoch FROM greatest(completes_at - coalesce($2::timestamptz, statement_timestamp()), interval '0')) * 1000
		  FROM fake_provider.requests
		 WHERE idempotency_key = $1`, key, at).
		Scan(&r.Key, &r.PolicyID, &r.Truth, &reason, &r.Attempts, &r.ReceivedAt, &r.CompletesAt, &untilMS)
	if err != nil {
		return request{}, err
	}
	if reason != nil {
		r.RejectReason = *reason
	}
	if r.Truth == provider.TruthRunning {
		r.untilComplete = time.Duration(untilMS * float64(time.Millisecond))
	}
	return r, nil
}

// Truth returns the provider's truth for key now, by the database clock.
func (p *Provider) Truth(ctx context.Context, key string) (provider.Truth, error) {
	return p.truth(ctx, key, nil)
}

// TruthAt returns the provider's truth for key as it will be (or was) at at,
// so tests can see a slow request complete without sleeping.
func (p *Provider) TruthAt(ctx context.Context, key string, at time.Time) (provider.Truth, error) {
	return p.truth(ctx, key, &at)
}

func (p *Provider) truth(ctx context.Context, key string, at *time.Time) (provider.Truth, error) {
	r, err := readRequest(ctx, p.Pool, key, at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return provider.TruthNotStarted, nil
	case err != nil:
		return "", fmt.Errorf("fake: truth of %s: %w", key, err)
	}
	return r.Truth, nil
}

// Effects is the effects ledger summed up, the JSON of GET /v1/effects.
type Effects struct {
	// Total counts effects that have taken hold.
	Total int64 `json:"total"`
	// Pending counts effects of slow calls accepted but not yet complete.
	Pending  int64          `json:"pending"`
	ByPolicy []PolicyEffect `json:"by_policy"`
	// Late lists the calls refused for arriving after their deadline
	// (nothing applied); left out when there are none.
	Late *fault.LateArrivals `json:"late,omitempty"`
}

// PolicyEffect is one policy's line in the ledger. Count above 1 is a double
// cancellation; an invariant check should add Pending, which will become
// Count by itself.
type PolicyEffect struct {
	PolicyID int64 `json:"policy_id"`
	Count    int64 `json:"count"`
	Pending  int64 `json:"pending"`
}

// Effects sums up the ledger now, by the database clock.
func (p *Provider) Effects(ctx context.Context) (Effects, error) { return p.effects(ctx, nil) }

// EffectsAt sums up the ledger as of at, so tests can see scheduled effects
// take hold without sleeping.
func (p *Provider) EffectsAt(ctx context.Context, at time.Time) (Effects, error) {
	return p.effects(ctx, &at)
}

func (p *Provider) effects(ctx context.Context, at *time.Time) (Effects, error) {
	rows, err := p.Pool.Query(ctx, `
		SELECT policy_id,
		       count(*) FILTER (WHERE applied_at <= coalesce($1::timestamptz, now())),
		       count(*) FILTER (WHERE applied_at > coalesce($1::timestamptz, now()))
		  FROM fake_provider.effects
		 GROUP BY policy_id
		 ORDER BY policy_id`, at)
	if err != nil {
		return Effects{}, fmt.Errorf("fake: effects: %w", err)
	}
	byPolicy, err := pgx.CollectRows(rows, pgx.RowToStructByPos[PolicyEffect])
	if err != nil {
		return Effects{}, fmt.Errorf("fake: effects: %w", err)
	}
	e := Effects{ByPolicy: byPolicy}
	for _, pe := range byPolicy {
		e.Total += pe.Count
		e.Pending += pe.Pending
	}
	late, err := p.Store.Late(ctx, p.Pool)
	if err != nil {
		return Effects{}, fmt.Errorf("fake: effects: %w", err)
	}
	if late.Total > 0 {
		e.Late = &late
	}
	return e, nil
}
