package labs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/events"
)

// Lab 4: where a consumer dedupes. "Mark the message seen, then handle it"
// is two commits; a failure between them leaves the message marked and its
// effect missing, and the redelivery that should repair it is thrown away
// as a duplicate. The consumer rule (events.Handler) records the inbox row
// and the effect in one transaction: a failure rolls both back, and the
// redelivery applies it once.
var inboxLab = &Lab{
	Number: 4,
	Name:   "inbox",
	Title:  "Dedupe before handling vs dedupe with the effect",
	Summary: "A consumer that marks a message seen before applying it loses the message when the apply fails; one " +
		"that marks and applies in one transaction does not.",
	Lesson: "A consumer receives three messages, and the first arrives twice (at-least-once delivery does that). " +
		"Handling the second fails once — the mail server it writes to is down for a moment — so the transport " +
		"delivers it again. The broken consumer marks each message seen in its inbox and commits, then applies the " +
		"effect in a second transaction: the failure leaves the message marked, the redelivery is dropped as a " +
		"duplicate, and the message is lost for good. The app's consumer rule, events.Handler, inserts the inbox row " +
		"and applies the effect in one transaction: the failure rolls both back, the redelivery applies it, and " +
		"every message takes effect exactly once.",
	Columns: []Column{
		{Key: "executions", Label: "messages"},
		{Key: "deliveries", Label: "deliveries"},
		{Key: "effects", Label: "effects applied"},
		colDuplicates,
		{Key: "lost", Label: "messages lost", Bad: true},
		{Key: "refused", Label: "duplicates caught"},
	},
	Code: []CodeRef{
		{Path: "internal/events/handler.go", Text: "err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {",
			Says: "the consumer rule: one transaction for the inbox row and the effect"},
		{Path: "internal/events/handler.go", Text: "if err := h.consumer.Apply(ctx, tx, d.Message); err != nil {",
			Says: "the effect, in the inbox row's transaction"},
		{Path: "internal/labs/inbox.go", Text: "-- a transaction of its own: the message is marked seen, come what may",
			Says: "brokenMarkSeenThenHandle: the mark commits before the effect is even tried"},
	},
	run: runInbox,
}

func runInbox(ctx context.Context, e *env) ([]Variant, error) {
	broken, err := e.consume(ctx, "broken", func(c *labConsumer) deliverFunc {
		return brokenMarkSeenThenHandle{pool: e, consumer: c}.handle
	})
	if err != nil {
		return nil, err
	}
	correct, err := e.consume(ctx, "correct", func(c *labConsumer) deliverFunc {
		h := events.NewHandler(e.lab, c, events.HandlerConfig{Transport: "lab", Instance: "lab", Logger: e.cfg.Logger})
		return h.Handle
	})
	if err != nil {
		return nil, err
	}
	broken.Title = "Mark seen, commit, then handle"
	correct.Title = "Inbox row and effect in one transaction (events.Handler)"
	return []Variant{broken, correct}, nil
}

// deliverFunc handles one delivery: an error means "deliver it again".
type deliverFunc func(ctx context.Context, d events.Delivery) (string, error)

// consume delivers the schedule to one consumer: m1, m1 again, m2 (its
// effect fails the first time), m3 — redelivering whatever the handler
// answered with an error, as every transport does.
func (e *env) consume(ctx context.Context, variant string, handler func(*labConsumer) deliverFunc) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Broken: variant == "broken", Counts: map[string]int{}}
	msgs := make([]events.Message, 3)
	for i := range msgs {
		msgs[i] = events.Message{ID: uuid.New(), Type: "lab.message", Key: fmt.Sprintf("lab:%d", i+1)}
	}
	label := map[uuid.UUID]string{msgs[0].ID: "m1", msgs[1].ID: "m2", msgs[2].ID: "m3"}
	c := &labConsumer{name: e.name("inbox", variant), failOnce: map[uuid.UUID]bool{msgs[1].ID: true}, label: label, t: t}
	deliver := handler(c)
	schedule := []events.Message{msgs[0], msgs[0], msgs[1], msgs[2]}
	// delivered counts each message's deliveries across the schedule, as a
	// transport's own count does: m1's repeat is its delivery 2, not 1 again.
	delivered := map[uuid.UUID]int{}
	for _, m := range schedule {
		for tries := 1; tries <= 3; tries++ {
			v.Counts["deliveries"]++
			delivered[m.ID]++
			attempt := delivered[m.ID]
			outcome, err := deliver(ctx, events.Delivery{Message: m, Attempt: attempt})
			if err != nil {
				t.say("transport", "%s delivery %d failed (%v): delivers it again", label[m.ID], attempt, errors.Unwrap(err))
				continue
			}
			if outcome == events.OutcomeDuplicate {
				v.Counts["refused"]++
				t.say("consumer", "%s delivery %d: already in the inbox, nothing applied — acknowledged", label[m.ID], attempt)
			} else {
				t.say("consumer", "%s delivery %d: applied — acknowledged", label[m.ID], attempt)
			}
			break
		}
	}
	v.Counts["executions"] = len(msgs)
	applied, err := c.applied(ctx, e)
	if err != nil {
		return v, err
	}
	for _, m := range msgs {
		switch n := applied[m.ID]; {
		case n == 0:
			v.Counts["lost"]++
			t.wrong("result", "%s is marked seen and was never applied: lost for good", label[m.ID])
		case n > 1:
			v.Counts["duplicates"] += n - 1
		}
		v.Counts["effects"] += applied[m.ID]
	}
	v.Verdict = fmt.Sprintf("%d of %s took effect", len(msgs)-v.Counts["lost"], plural(len(msgs), "message"))
	v.Timeline = t.list()
	return v, nil
}

// labConsumer applies a message by writing a line to consumer_effects. The
// messages in failOnce fail their first application: the schedule's fault.
type labConsumer struct {
	name     string
	label    map[uuid.UUID]string // m1, m2, m3: the names the timeline uses
	t        *timeline
	mu       sync.Mutex
	failOnce map[uuid.UUID]bool
}

func (c *labConsumer) Name() string { return c.name }

func (c *labConsumer) Apply(ctx context.Context, tx pgx.Tx, m events.Message) error {
	if _, err := tx.Exec(ctx, `
		INSERT INTO consumer_effects (consumer, event_id)
		VALUES ($1, $2)`, c.name, m.ID); err != nil {
		return err
	}
	c.mu.Lock()
	fail := c.failOnce[m.ID]
	delete(c.failOnce, m.ID)
	c.mu.Unlock()
	if fail {
		c.t.say("consumer", "applying %s fails: the mail server is down for a moment", c.label[m.ID])
		return errors.New("the mail server is down")
	}
	return nil
}

// applied counts the committed effects per message.
func (c *labConsumer) applied(ctx context.Context, e *env) (map[uuid.UUID]int, error) {
	rows, err := e.lab.Query(ctx, `
		SELECT event_id, count(*)
		  FROM consumer_effects
		 WHERE consumer = $1
		 GROUP BY event_id`, c.name)
	if err != nil {
		return nil, fmt.Errorf("labs: effects of %s: %w", c.name, err)
	}
	out := map[uuid.UUID]int{}
	var id uuid.UUID
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	return out, err
}

// brokenMarkSeenThenHandle dedupes before handling: it commits the inbox
// row on its own, then applies the effect in a second transaction.
type brokenMarkSeenThenHandle struct {
	pool     *env
	consumer *labConsumer
}

func (b brokenMarkSeenThenHandle) handle(ctx context.Context, d events.Delivery) (string, error) {
	tag, err := b.pool.lab.Exec(ctx, `
		-- a transaction of its own: the message is marked seen, come what may
		INSERT INTO inbox (consumer, event_id, event_type)
		VALUES ($1, $2, $3)
		    ON CONFLICT DO NOTHING`,
		b.consumer.name, d.ID, d.Type)
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 0 {
		return events.OutcomeDuplicate, nil
	}
	err = pgx.BeginFunc(ctx, b.pool.lab, func(tx pgx.Tx) error { return b.consumer.Apply(ctx, tx, d.Message) })
	if err != nil {
		return "", fmt.Errorf("labs: apply: %w", err)
	}
	return events.OutcomeApplied, nil
}
