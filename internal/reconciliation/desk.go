package reconciliation

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/workflow"
)

// This file is the reconciliation desk's reading and asking: each
// operation waiting for a person with its evidence (every call for its
// stuck step, every status answer, the timeline), the facts Advise works
// from, and "ask again" — a status query a person asks for, recorded like
// recovery's own and deciding nothing.

// Desk is the reconciliation desk: the operations recovery handed to a
// person (NEEDS_RECONCILIATION), their evidence and advice, and the
// person's decisions, which the engine writes (workflow.Engine.Decide).
type Desk struct {
	pool   *pgxpool.Pool
	engine *workflow.Engine
}

// New returns the desk over the engine's operations.
func New(pool *pgxpool.Pool, engine *workflow.Engine) *Desk {
	return &Desk{pool: pool, engine: engine}
}

// Item is one operation waiting for a person, with its evidence.
type Item struct {
	Operation  workflow.Operation     `json:"operation"`
	Stuck      workflow.StepRecord    `json:"stuck_step"`
	HandedOver time.Time              `json:"handed_over_at"`
	Facts      Facts                  `json:"-"`
	Advice     Advice                 `json:"advice"`
	Calls      []readmodel.CallRecord `json:"calls"` // every exchange for the stuck step, oldest first
	// ThenCall and NowCall are the status answers Facts.Then and Facts.Now
	// come from (nil: none).
	ThenCall *readmodel.CallRecord `json:"then_call"`
	NowCall  *readmodel.CallRecord `json:"now_call"`
}

// Truth is the card's truth now in one word: a system's answer, or UNKNOWN;
// NOT_STARTED while a call may still arrive is NOT_STARTED_PENDING.
func (it Item) Truth() string {
	switch {
	case it.Facts.Now == "":
		return TruthUnknown
	case it.Facts.Now == external.TruthNotStarted && !it.Facts.NotStartedConclusive():
		return TruthNotStartedPending
	}
	return string(it.Facts.Now)
}

// TruthNotStartedPending is NOT_STARTED asked before every earlier call's
// deadline (plus the margin) had passed: not conclusive yet.
const TruthNotStartedPending = "NOT_STARTED_PENDING"

// Config is what the desk's facts need from recovery's settings.
type Config struct {
	ClockSkew   time.Duration // the margin on every deadline
	MaxAttempts int           // for the reason's sentence
}

// Waiting returns up to limit operations waiting for a person, longest
// waiting first, each with its evidence and advice.
func (d *Desk) Waiting(ctx context.Context, cfg Config, limit int) ([]Item, error) {
	ops, err := d.engine.ListByStatus(ctx, workflow.StatusNeedsReconciliation, limit)
	if err != nil {
		return nil, err
	}
	return d.items(ctx, d.pool, cfg, ops)
}

// WaitingItem returns operation id with its evidence, if it waits for a person.
func (d *Desk) WaitingItem(ctx context.Context, cfg Config, id int64) (Item, error) {
	op, err := d.engine.GetOperation(ctx, id, 0, true)
	if err != nil {
		return Item{}, err
	}
	if op.Status != workflow.StatusNeedsReconciliation {
		return Item{}, ErrNotWaiting
	}
	items, err := d.items(ctx, d.pool, cfg, []workflow.Operation{op})
	if err != nil {
		return Item{}, err
	}
	return items[0], nil
}

// CountWaiting is how many operations wait for a person (the nav badge).
func (d *Desk) CountWaiting(ctx context.Context) (int, error) {
	var n int
	err := d.pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status = 'NEEDS_RECONCILIATION'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reconciliation: count waiting: %w", err)
	}
	return n, nil
}

// ErrNotWaiting: the operation does not wait for a person (any more).
var ErrNotWaiting = fmt.Errorf("%w: it does not wait for a person", workflow.ErrStateChanged)

// items reads the evidence of ops (in db: the pool, or a decision's
// transaction) in four queries whatever their number.
func (d *Desk) items(ctx context.Context, db database.DBTX, cfg Config, ops []workflow.Operation) ([]Item, error) {
	if len(ops) == 0 {
		return []Item{}, nil
	}
	items := make([]Item, len(ops))
	ids, keys := make([]int64, len(ops)), make([]string, 0, len(ops))
	byKey := map[string]*Item{}
	for i, op := range ops {
		items[i].Operation = op
		ids[i] = op.ID
		if stuck, ok := op.Stuck(); ok {
			items[i].Stuck = stuck
			keys = append(keys, stuck.Key)
			byKey[stuck.Key] = &items[i]
		}
	}
	// When each was handed to a person: its latest move to NEEDS_RECONCILIATION.
	rows, err := db.Query(ctx, `
		SELECT operation_id, max(at)
		  FROM operation_events
		 WHERE operation_id = ANY($1)
		   AND to_status = 'NEEDS_RECONCILIATION'
		 GROUP BY operation_id`, ids)
	if err != nil {
		return nil, fmt.Errorf("reconciliation: hand-over times: %w", err)
	}
	handed := map[int64]time.Time{}
	var id int64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { handed[id] = at; return nil }); err != nil {
		return nil, fmt.Errorf("reconciliation: hand-over times: %w", err)
	}
	// Every exchange for the stuck steps.
	rows, err = db.Query(ctx, `
		SELECT id, step_key, kind, call_id, system, actor, owner_token::text, at, attempt, deadline_at,
		       request, outcome, truth, detail, took_ms
		  FROM operation_calls
		 WHERE operation_id = ANY($2) -- operation_calls_pkey
		   AND step_key = ANY($1)
		 ORDER BY id`, keys, ids)
	if err != nil {
		return nil, fmt.Errorf("reconciliation: calls: %w", err)
	}
	calls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[readmodel.CallRecord])
	if err != nil {
		return nil, fmt.Errorf("reconciliation: calls: %w", err)
	}
	for _, c := range calls {
		if it := byKey[c.StepKey]; it != nil {
			it.Calls = append(it.Calls, c)
		}
	}
	beliefs, err := recovery.Beliefs(ctx, db)
	if err != nil {
		return nil, err
	}
	idempotent := map[string]bool{}
	for _, b := range beliefs {
		idempotent[b.System] = b.Idempotent
	}
	for i := range items {
		it := &items[i]
		it.HandedOver = handed[it.Operation.ID]
		if it.Calls == nil {
			it.Calls = []readmodel.CallRecord{}
		}
		it.Facts = d.facts(cfg, it, idempotent)
		it.Advice = Advise(it.Facts)
	}
	return items, nil
}

// facts reads an item's evidence the way Advise needs it.
func (d *Desk) facts(cfg Config, it *Item, idempotent map[string]bool) Facts {
	canFail := false
	if st, ok := d.engine.Step(it.Operation.Type, it.Stuck.Name); ok {
		canFail = st.Refused == workflow.FailOperation
	}
	return readFacts(cfg, it, idempotent, canFail)
}

// readFacts is facts without the engine: canFail is whether a refusal of
// the stuck step fails the operation.
func readFacts(cfg Config, it *Item, idempotent map[string]bool, canFail bool) Facts {
	s := it.Stuck
	f := Facts{Step: s.Name, Attempts: it.Operation.Attempts, MaxAttempts: cfg.MaxAttempts}
	if s.System != nil {
		f.System = *s.System
		f.Idempotent = idempotent[f.System]
	}
	switch {
	case it.Operation.CancelRequestedAt != nil && !s.External():
		// Cancelled after an effect nothing undoes (workflow/cancel.go):
		// stopped before a local step, the effect that stood the truth.
		f.Reason, f.CancelledBy = ReasonCancelled, database.Deref(it.Operation.CancelRequestedBy)
		for _, st := range it.Operation.Steps {
			if st.Name == s.Name {
				break
			}
			if st.External() && st.State == workflow.StepDone {
				f.Stood = append(f.Stood, st.Name+" at "+database.Deref(st.System))
			}
		}
		f.Then, f.Now = external.TruthCompleted, external.TruthCompleted
		return f
	case s.State == workflow.StepFailed:
		f.Reason = ReasonRefused
	case s.External() && (s.State == workflow.StepSent || s.State == workflow.StepUnknown):
		f.Reason = ReasonOutOfAttempts
	default:
		f.Reason = ReasonInconsistent
	}
	f.CanFail = canFail
	// A call may arrive until the latest deadline any attempt carried.
	latest := s.DeadlineAt
	for i, c := range it.Calls {
		switch {
		case c.Kind == "call" && c.DeadlineAt != nil && (latest == nil || c.DeadlineAt.After(*latest)):
			latest = c.DeadlineAt
		case c.Kind != "status":
		case !c.At.After(it.HandedOver):
			it.ThenCall = &it.Calls[i]
		default:
			it.NowCall = &it.Calls[i]
		}
	}
	if latest != nil {
		f.ArrivesUntil = latest.Add(cfg.ClockSkew)
	}
	if it.ThenCall != nil && it.ThenCall.Truth != nil {
		f.Then = external.Truth(*it.ThenCall.Truth)
	}
	if c := it.NowCall; c != nil {
		f.NowAt = c.At
		if c.Truth != nil {
			f.Now = external.Truth(*c.Truth)
		} else {
			f.NowError = c.Detail
		}
	}
	if f.Reason == ReasonRefused {
		// The call's own answer was a definite refusal: that is the truth
		// at the hand-over, and now, until a status query *answers*
		// otherwise. A query that got no answer says nothing about the call,
		// so it cannot turn a known refusal into "no answer" — the card, the
		// reason and the truth filter keep saying REJECTED (issue 29, 6).
		if f.Then == "" {
			f.Then = external.TruthRejected
		}
		if f.Now == "" {
			f.Now, f.NowIsRefusal = external.TruthRejected, true
		}
	}
	return f
}

// AskAgain asks the system behind each operation's stuck step for the
// truth of its key, now, and records every answer (or that none came) in
// operation_calls as actor's. It decides nothing and changes no operation,
// so a decision form open on a page stays valid; the next reading of the
// desk advises from the new answers. Operations no longer waiting for a
// person, or stuck at a step that calls nothing, are skipped. It returns
// how many were asked and how many answered.
func (d *Desk) AskAgain(ctx context.Context, ids []int64, actor string, timeout time.Duration) (asked, answered int, err error) {
	ops, err := d.engine.Operations(ctx, ids)
	if err != nil {
		return 0, 0, err
	}
	type answer struct {
		op    workflow.Operation
		key   string
		sys   string
		truth external.Truth
		err   error
		took  time.Duration
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
		slots   = make(chan struct{}, 16) // a desk of hundreds asks 16 at a time
	)
	for _, op := range ops {
		if op.Status != workflow.StatusNeedsReconciliation {
			continue
		}
		stuck, ok := op.Stuck()
		if !ok || !stuck.External() {
			continue
		}
		st, ok := d.engine.Step(op.Type, stuck.Name)
		if !ok || st.Call == nil {
			continue
		}
		wg.Add(1)
		slots <- struct{}{}
		go func(op workflow.Operation, rec workflow.StepRecord, call workflow.Caller) {
			defer func() { <-slots; wg.Done() }()
			askCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			start := time.Now()
			truth, err := call.Status(askCtx, rec.Key)
			mu.Lock()
			answers = append(answers, answer{op: op, key: rec.Key, sys: *rec.System, truth: truth, err: err, took: time.Since(start)})
			mu.Unlock()
		}(op, stuck, st.Call)
	}
	wg.Wait()
	if len(answers) == 0 {
		return 0, 0, nil
	}
	// One statement records them all.
	n := len(answers)
	opIDs, keys, systems, truths, details, took := make([]int64, n), make([]string, n), make([]string, n),
		make([]*string, n), make([]string, n), make([]int64, n)
	for i, a := range answers {
		opIDs[i], keys[i], systems[i], took[i] = a.op.ID, a.key, a.sys, a.took.Milliseconds()
		if a.err != nil {
			details[i] = a.err.Error()
		} else {
			if a.truth != "" {
				truth := string(a.truth)
				truths[i] = &truth
			}
			answered++
		}
	}
	_, err = d.pool.Exec(ctx, `
		INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, truth, detail, took_ms)
		SELECT operation_id, step_key, 'status', system, $5, truth, detail, took_ms
		  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $6::text[], $7::bigint[])
		       AS a(operation_id, step_key, system, truth, detail, took_ms)`,
		opIDs, keys, systems, truths, actor, details, took)
	if err != nil {
		return 0, 0, fmt.Errorf("reconciliation: record the answers: %w", err)
	}
	return n, answered, nil
}

// Settled is what became of operations a person asked about: how many
// still wait for a person, and of those that no longer do, how many
// recovery took back on its own (its own question, asked meanwhile, had
// settled them) and how many a person decided (or acted on).
type Settled struct {
	Waiting    int `json:"still_waiting"`
	ByRecovery int `json:"settled_by_recovery"`
	ByPerson   int `json:"decided_by_a_person"`
}

// Settled says what became of ids since they waited for a person, read
// from how each last left the desk: recovery's take-back is the re-ask
// branch (workflow.BranchReasked); any other way out is a person's.
func (d *Desk) Settled(ctx context.Context, ids []int64) (Settled, error) {
	var s Settled
	err := d.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE o.status = 'NEEDS_RECONCILIATION'),
		       count(*) FILTER (WHERE o.status <> 'NEEDS_RECONCILIATION' AND out.left_desk AND out.branch = $2),
		       count(*) FILTER (WHERE o.status <> 'NEEDS_RECONCILIATION' AND out.left_desk AND out.branch IS DISTINCT FROM $2)
		  FROM operations o
		  LEFT JOIN LATERAL (
		        -- its latest way out of the desk (none: it never waited, and is not counted)
		        SELECT true AS left_desk, e.branch
		          FROM operation_events e
		         WHERE e.operation_id = o.id
		           AND e.from_status = 'NEEDS_RECONCILIATION'
		           AND e.to_status <> 'NEEDS_RECONCILIATION'
		         ORDER BY e.at DESC, e.id DESC
		         LIMIT 1) out ON true
		 WHERE o.id = ANY($1)`, ids, workflow.BranchReasked).Scan(&s.Waiting, &s.ByRecovery, &s.ByPerson)
	if err != nil {
		return Settled{}, fmt.Errorf("reconciliation: what became of the items asked about: %w", err)
	}
	return s, nil
}

// Decision is one line of the desk's audit trail.
type Decision struct {
	ID              int64     `json:"id"`
	OperationID     int64     `json:"operation_id"`
	StepKey         string    `json:"step_key"`
	At              time.Time `json:"at"`
	DecidedBy       string    `json:"decided_by"`
	Actor           string    `json:"actor"`
	Decision        string    `json:"decision"`
	SeenUpdatedAt   time.Time `json:"seen_updated_at"`
	TruthSeen       string    `json:"truth_seen"`
	TruthCallID     *int64    `json:"truth_call_id"`
	TruthAtDecision *string   `json:"truth_at_decision"`
	Suggested       string    `json:"suggested"`
	BatchSize       int       `json:"batch_size"`
	Note            string    `json:"note"`
}

// Decisions returns the newest decisions, of one operation when
// operationID > 0.
func (d *Desk) Decisions(ctx context.Context, operationID int64, limit int) ([]Decision, error) {
	rows, err := d.pool.Query(ctx, `
		SELECT id, operation_id, step_key, at, decided_by, actor, decision, seen_updated_at, truth_seen,
		       truth_call_id, truth_at_decision, suggested, batch_size, note
		  FROM reconciliation_decisions
		 WHERE $1 = 0 OR operation_id = $1
		 ORDER BY at DESC, id DESC
		 LIMIT $2`, operationID, limit)
	if err != nil {
		return nil, fmt.Errorf("reconciliation: decisions: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Decision])
	if err != nil {
		return nil, fmt.Errorf("reconciliation: decisions: %w", err)
	}
	return out, nil
}
