package policies

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/workflow"
)

// This file is what each step of the cancellation does. The engine decides
// when a step runs and records it; these functions only do the work.

// providerCancel is provider_cancel's call: the provider cancels the policy
// under the step's key.
type providerCancel struct{ client provider.Client }

// cancelCall is provider_cancel's request, stored with the step.
type cancelCall struct {
	PolicyID int64  `json:"policy_id"`
	Reason   string `json:"reason"`
}

func (providerCancel) System() string { return "provider" }

func (providerCancel) Request(_ context.Context, _ pgx.Tx, op workflow.Operation) (any, error) {
	return cancelCall{PolicyID: op.PolicyID, Reason: op.Reason}, nil
}

func (p providerCancel) Deadline() time.Time { return p.client.Deadline() }

func (p providerCancel) Send(ctx context.Context, call workflow.Call) (external.Result, error) {
	var req cancelCall
	if err := json.Unmarshal(call.Request, &req); err != nil {
		return external.Result{}, fmt.Errorf("policies: provider_cancel request: %w", err)
	}
	return p.client.Cancel(ctx, provider.CancelRequest{Key: call.Key, PolicyID: req.PolicyID, Reason: req.Reason, Deadline: call.Deadline})
}

func (p providerCancel) Status(ctx context.Context, key string) (external.Truth, error) {
	return p.client.Status(ctx, key)
}

// markCancelled is mark_cancelled: the policy is CANCELLED, in the
// transaction that records the provider's confirmation.
func markCancelled(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	tag, err := tx.Exec(ctx, `
		UPDATE policies
		   SET status = 'CANCELLED',
		       updated_at = now()
		 WHERE id = $1
		   AND status = 'ACTIVE' -- only the cancellation's own step cancels a policy, once`, op.PolicyID)
	if err != nil {
		return "", fmt.Errorf("policies: mark policy cancelled: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", fmt.Errorf("policies: policy %d is not ACTIVE", op.PolicyID)
	}
	return fmt.Sprintf("policy %d CANCELLED", op.PolicyID), nil
}

// refundCents is what cancelling the policy today refunds: the premium of
// the days not used, prorated to the day, in cents (rounded half up).
// Before the coverage starts that is the whole premium; after it ends,
// nothing. The day is the database's (UTC), and now() is the
// transaction's, so every step of one transaction computes the same amount.
const refundCents = `round(premium * 100
       * greatest(0, coverage_end - greatest((now() AT TIME ZONE 'UTC')::date, coverage_start))
       / (coverage_end - coverage_start))::bigint`

// refundColumns are a policy's number and what it refunds, in cents and as
// the decimal text the event carries.
const refundColumns = `number, ` + refundCents + `, (` + refundCents + ` / 100.0)::numeric(12, 2)::text`

// refund is what a cancellation owes back.
type refund struct {
	number string // the policy's
	cents  int64
	amount string // the same, as decimal text: "120.00"
}

// refundOwed returns what cancelling policyID today refunds. publish_event
// and the refund's request each read it in the transaction that cancels
// the policy (the same now(), so the same amount), or in the one that
// resumes a run.
func refundOwed(ctx context.Context, tx pgx.Tx, policyID int64) (refund, error) {
	var r refund
	if err := tx.QueryRow(ctx, `SELECT `+refundColumns+` FROM policies WHERE id = $1`, policyID).Scan(&r.number, &r.cents, &r.amount); err != nil {
		return refund{}, fmt.Errorf("policies: refund owed on %d: %w", policyID, err)
	}
	return r, nil
}

// paymentsRefund is the refund step's call: the payments service pays the
// policy's unused premium back under the step's key.
type paymentsRefund struct{ client payments.Client }

// refundCall is the refund step's request, stored with the step.
type refundCall struct {
	PolicyID    int64  `json:"policy_id"`
	AmountCents int64  `json:"amount_cents"`
	Amount      string `json:"amount"`
	Reason      string `json:"reason"`
}

func (paymentsRefund) System() string { return "payments" }

// Request computes the refund once, in the transaction that cancels the
// policy; every retry sends this same amount. Nothing owed: no call.
func (paymentsRefund) Request(ctx context.Context, tx pgx.Tx, op workflow.Operation) (any, error) {
	r, err := refundOwed(ctx, tx, op.PolicyID)
	if err != nil {
		return nil, err
	}
	if r.cents == 0 {
		return nil, workflow.Skip("nothing to refund: the coverage had ended")
	}
	return refundCall{PolicyID: op.PolicyID, AmountCents: r.cents, Amount: r.amount,
		Reason: fmt.Sprintf("unused premium of %s, cancelled", r.number)}, nil
}

func (p paymentsRefund) Deadline() time.Time { return p.client.Deadline() }

func (p paymentsRefund) Send(ctx context.Context, call workflow.Call) (external.Result, error) {
	var req refundCall
	if err := json.Unmarshal(call.Request, &req); err != nil {
		return external.Result{}, fmt.Errorf("policies: refund request: %w", err)
	}
	return p.client.Refund(ctx, payments.RefundRequest{Key: call.Key, PolicyID: req.PolicyID, AmountCents: req.AmountCents,
		Reason: req.Reason, Deadline: call.Deadline})
}

func (p paymentsRefund) Status(ctx context.Context, key string) (external.Truth, error) {
	return p.client.RefundStatus(ctx, key)
}

// publishCancelled is publish_event: policy.cancelled goes into the outbox
// in the transaction that cancels the policy — both or neither — naming
// the refund it owes by the refund step's key.
func (c *Canceller) publishCancelled(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	r, err := refundOwed(ctx, tx, op.PolicyID)
	if err != nil {
		return "", err
	}
	id, err := c.outbox.Write(ctx, tx, events.NewPolicyCancelled(events.PolicyCancelled{
		PolicyID: op.PolicyID, PolicyNumber: r.number, UserID: op.UserID, OperationID: op.ID,
		RefundKey: workflow.StepKey(op.ID, StepRefund, op.Run), RefundAmount: r.amount, CancelledAt: time.Now().UTC(),
	}))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("policy.cancelled in the outbox as event %s (refund %s owed)", id, r.amount), nil
}

// audit is the last step: one line of audit trail per run, keyed by the
// step, written in the transaction that finishes the workflow.
func audit(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	facts := map[string]any{"policy_id": op.PolicyID, "operation_id": op.ID, "run": op.Run, "request_key": op.IdempotencyKey}
	for _, s := range op.Steps {
		if s.External() {
			facts[s.Name] = map[string]any{"key": s.Key, "state": s.State, "attempts": s.Attempts, "request": s.Request}
		}
	}
	raw, err := json.Marshal(facts)
	if err != nil {
		return "", err
	}
	summary := fmt.Sprintf("policy %d cancelled (operation %d, run %d)", op.PolicyID, op.ID, op.Run)
	_, err = tx.Exec(ctx, `
		INSERT INTO audit_entries (operation_id, step_key, actor, summary, facts)
		VALUES ($1, $2, $3, $4, $5)`,
		op.ID, workflow.StepKey(op.ID, StepAudit, op.Run), database.Deref(op.OwnerID), summary, raw)
	if err != nil {
		return "", fmt.Errorf("policies: audit: %w", err)
	}
	return "audit entry written", nil
}
