package labs

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Lab 5: how an outbox relay finds its work. A sequence number is handed
// out when a row is inserted, not when it commits, so rows become visible
// out of number order; a relay that remembers "everything up to N is sent"
// steps over a smaller number that commits late, for good. A relay that
// claims PENDING rows (FOR UPDATE SKIP LOCKED) asks about each row's state,
// not its place in a sequence, and finds the late one at its next pass.
var relayLab = &Lab{
	Number: 5,
	Name:   "relay",
	Title:  "Outbox relay by offset vs by claim",
	Summary: "A relay that reads by offset skips an event that commits late; a relay that claims the PENDING rows " +
		"sends it.",
	Lesson: "Two transactions each write an event to the outbox. The first takes sequence number n but is slow to " +
		"commit; the second takes n+1 and commits at once. A relay pass runs in between, then the first commits, " +
		"then the relay passes again. The relay that reads seq > last_sent sees n+1 in its first pass, moves its " +
		"offset past it, and never looks at n again: that event is lost without an error anywhere. The relay that " +
		"claims PENDING rows with FOR UPDATE SKIP LOCKED and marks them SENT — the app's relay does that — sends n+1 " +
		"first and n at its next pass: both delivered, once each.",
	Columns: []Column{
		{Key: "executions", Label: "events committed"},
		{Key: "effects", Label: "delivered"},
		colDuplicates,
		{Key: "lost", Label: "lost for good", Bad: true},
	},
	Code: []CodeRef{
		{Path: "internal/events/relay.go", Text: "AND status = 'PENDING'",
			Says: "the app's relay claims rows by their state …"},
		{Path: "internal/events/relay.go", Text: "FOR UPDATE SKIP LOCKED -- rows another relay is claiming right now are skipped, not waited for",
			Says: "… and skips rows another relay holds, instead of waiting or remembering an offset"},
		{Path: "internal/labs/relay.go", Text: "AND seq > $3",
			Says: "brokenOffsetRelay: the offset steps over a row that committed late"},
	},
	run: runRelay,
}

func runRelay(ctx context.Context, e *env) ([]Variant, error) {
	broken, err := e.relayRace(ctx, "broken", &brokenOffsetRelay{})
	if err != nil {
		return nil, err
	}
	correct, err := e.relayRace(ctx, "correct", claimingRelay{})
	if err != nil {
		return nil, err
	}
	broken.Title = "Relay reads seq > last_sent"
	correct.Title = "Relay claims PENDING rows (FOR UPDATE SKIP LOCKED)"
	return []Variant{broken, correct}, nil
}

// relay is one way to move outbox rows to the broker: one pass.
type relay interface {
	pass(ctx context.Context, e *env, variant string, t *timeline) (sent int, err error)
}

// relayRace plays the schedule: A inserts (n) and waits, B inserts (n+1)
// and commits, the relay passes, A commits, the relay passes twice more.
func (e *env) relayRace(ctx context.Context, variant string, r relay) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Broken: variant == "broken", Counts: map[string]int{}}
	txA, err := e.lab.Begin(ctx)
	if err != nil {
		return v, err
	}
	defer txA.Rollback(context.WithoutCancel(ctx))
	seqA, err := e.writeEvent(ctx, txA, variant, "event A")
	if err != nil {
		return v, err
	}
	t.say("writer A", "inserted event A: seq %d — its transaction is still open", seqA)
	var seqB int64
	err = pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
		var err error
		seqB, err = e.writeEvent(ctx, tx, variant, "event B")
		return err
	})
	if err != nil {
		return v, err
	}
	t.say("writer B", "inserted event B: seq %d — committed", seqB)
	if _, err := r.pass(ctx, e, variant, t); err != nil {
		return v, err
	}
	if err := txA.Commit(ctx); err != nil {
		return v, err
	}
	t.say("writer A", "committed event A (seq %d), after event B", seqA)
	for range 2 {
		if _, err := r.pass(ctx, e, variant, t); err != nil {
			return v, err
		}
	}

	var published, distinct int
	err = e.lab.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT seq)
		  FROM published
		 WHERE run_id = $1
		   AND variant = $2`, e.run, variant).Scan(&published, &distinct)
	if err != nil {
		return v, fmt.Errorf("relay: published: %w", err)
	}
	v.Counts["executions"] = 2
	v.Counts["effects"] = distinct
	v.Counts["duplicates"] = published - distinct
	v.Counts["lost"] = 2 - distinct
	if v.Counts["lost"] > 0 {
		t.wrong("result", "event A is committed and will never be sent: the offset is past it")
	}
	v.Verdict = fmt.Sprintf("%d of 2 committed events delivered", distinct)
	v.Timeline = t.list()
	return v, nil
}

// writeEvent inserts an outbox row in tx and returns its sequence number,
// taken now — not when tx commits.
func (e *env) writeEvent(ctx context.Context, tx pgx.Tx, variant, name string) (int64, error) {
	var seq int64
	err := tx.QueryRow(ctx, `
		INSERT INTO outbox (run_id, variant, name)
		VALUES ($1, $2, $3)
		RETURNING seq`, e.run, variant, name).Scan(&seq)
	if err != nil {
		return 0, fmt.Errorf("relay: write %s: %w", name, err)
	}
	return seq, nil
}

// brokenOffsetRelay sends rows in sequence order after the last one it
// sent, and keeps that offset: what commits later with a smaller number is
// behind it forever.
type brokenOffsetRelay struct {
	lastSent int64
}

func (r *brokenOffsetRelay) pass(ctx context.Context, e *env, variant string, t *timeline) (int, error) {
	rows, err := e.lab.Query(ctx, `
		SELECT seq, name
		  FROM outbox
		 WHERE run_id = $1
		   AND variant = $2
		   AND seq > $3
		 ORDER BY seq`, e.run, variant, r.lastSent)
	if err != nil {
		return 0, err
	}
	type row struct {
		Seq  int64
		Name string
	}
	due, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return 0, err
	}
	for _, d := range due {
		if _, err := e.lab.Exec(ctx, `
			INSERT INTO published (run_id, variant, seq, name)
			VALUES ($1, $2, $3, $4)`, e.run, variant, d.Seq, d.Name); err != nil {
			return 0, err
		}
		r.lastSent = d.Seq
	}
	t.say("relay", "pass: %d sent; offset now %d", len(due), r.lastSent)
	return len(due), nil
}

// claimingRelay claims the PENDING rows it can lock, sends them, and marks
// them SENT in the same transaction — the shape of the app's relay
// (internal/events), minus its lease, since this broker is a table.
type claimingRelay struct{}

func (claimingRelay) pass(ctx context.Context, e *env, variant string, t *timeline) (int, error) {
	var sent []string
	err := pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			UPDATE outbox o
			   SET status = 'SENT'
			  FROM (SELECT seq
			          FROM outbox
			         WHERE run_id = $1
			           AND variant = $2
			           AND status = 'PENDING'
			         ORDER BY seq
			           -- rows another relay holds are skipped; an uncommitted row is not there yet
			           FOR UPDATE SKIP LOCKED) due
			 WHERE o.seq = due.seq
			RETURNING o.seq, o.name`, e.run, variant)
		if err != nil {
			return err
		}
		type row struct {
			Seq  int64
			Name string
		}
		claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil {
			return err
		}
		for _, c := range claimed {
			sent = append(sent, c.Name)
			if _, err := tx.Exec(ctx, `
				INSERT INTO published (run_id, variant, seq, name)
				VALUES ($1, $2, $3, $4)`, e.run, variant, c.Seq, c.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	t.say("relay", "pass: %s claimed and sent %v", plural(len(sent), "PENDING row"), sent)
	return len(sent), nil
}
