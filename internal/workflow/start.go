package workflow

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// This file is how a request starts an operation: its first transaction,
// then the runner (run.go) drives the rest, the same code recovery resumes.

// StartFunc records a new operation's intent — its first step — in tx, as
// owner, and returns it: a new operation, or a FAILED one started again
// (next run) — with its run's steps when the start laid them out itself (a
// retry from a step: RetryFrom). Business refusals are returned wrapped in Refused. When the
// request that started an existing operation comes back (same request key:
// its first attempt died before answering), it returns that operation with
// existing true: nothing runs again, the answer is the operation as it is.
type StartFunc func(ctx context.Context, tx pgx.Tx, owner Owner) (op Operation, existing bool, err error)

// Start runs a new operation of type typ for a request:
//
//	tx 1:  hooks.Begin · start (the intent) · the local steps that follow ·
//	       the SENT of the first external step, with its deadline
//	       ── no transaction open ──
//	call:  the external step, under its step key
//	tx 2:  its outcome · the local steps that follow · the next SENT …
//	       … and hooks.Finish in the transaction where the request stops:
//	       the operation finished, refused, or handed to recovery
//
// A refusal of start (an error wrapped in Refused) goes to hooks.Finish in
// tx 1 and is returned, still wrapped, once committed. Any other error rolls its transaction back and is returned:
// ErrLeaseLost when recovery took the operation over meanwhile (the outcome
// is its to record), or a database failure.
func (e *Engine) Start(ctx context.Context, typ, actor string, start StartFunc, hooks Hooks[Operation]) (Operation, error) {
	def, ok := e.defs[typ]
	if !ok {
		return Operation{}, fmt.Errorf("workflow: no definition for %q", typ)
	}
	owner := Owner{ID: actor, Lease: e.cfg.Lease}
	var (
		r       *runner
		next    *pending
		refusal error
		result  Operation // the answer when the request stops in tx 1
	)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		r, next, refusal = nil, nil, nil // a retried transaction starts over
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		op, existing, err := start(ctx, tx, owner)
		switch {
		case IsRefused(err):
			refusal = err
			return hooks.RunFinish(ctx, tx, Operation{}, err)
		case err != nil:
			return err
		case existing:
			if result, err = e.recordRetry(ctx, tx, op.ID, actor); err != nil {
				return err
			}
			return hooks.RunFinish(ctx, tx, result, nil)
		}
		r = e.runner(def, op, actor)
		if op.Steps == nil { // a retry from a step lays its run out itself (RetryFrom)
			if err := r.insertSteps(ctx, tx); err != nil {
				return err
			}
		}
		r.crash(ctx, crashAfter(def.Steps[0].Name))
		if next, err = r.advance(ctx, tx, true); err != nil {
			return err
		}
		if err := r.flush(ctx, tx); err != nil {
			return err
		}
		if next == nil {
			result = r.op
			return hooks.RunFinish(ctx, tx, r.op, nil)
		}
		return nil
	})
	switch {
	case err != nil:
		return Operation{}, r.fenced(ctx, err)
	case refusal != nil:
		return Operation{}, refusal
	case next == nil:
		r.crash(ctx, CrashAfterCommit)
		return result, nil
	}
	// From here on the work continues even if the client goes away: it will
	// retry with the same key and must find the work done or owned.
	op, err := r.drive(context.WithoutCancel(ctx), next, r.handOver, hooks)
	if err != nil {
		return Operation{}, err
	}
	r.crash(ctx, CrashAfterCommit)
	return op, nil
}

// recordRetry notes that the request which started opID came back with the
// same key, and returns the operation as it is. It changes nothing.
func (e *Engine) recordRetry(ctx context.Context, tx pgx.Tx, opID int64, actor string) (Operation, error) {
	op, err := e.operation(ctx, tx, opID)
	if err != nil {
		return Operation{}, err
	}
	return op, recordEvent(ctx, tx, event{op: op, from: op.Status, actor: actor,
		detail: "the request that started this operation was retried with the same key: answered with the operation as it is now"})
}
