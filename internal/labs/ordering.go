package labs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
)

// Lab 12: per-key order. Exactly once is not in order: both consumers here
// go through the consumer rule (events.Handler: inbox and effect in one
// transaction), so each event takes effect once — and the naive projection
// still ends wrong, because the transport handed one booking's events over
// out of order. The versioned one (events.History) checks each event's
// place in its aggregate (outbox.seq) and parks an early one until its
// predecessor comes.
var orderingLab = &Lab{
	Number: 12,
	Name:   "ordering",
	Title:  "Per-key order: last arrival wins vs a version per aggregate",
	Summary: "One booking's events arriving out of order: a projection that applies whatever arrives last, and one " +
		"that keeps a version per booking.",
	Lesson: "One booking's three events — held (1), confirmed (2), released (3) — are committed in that order, each " +
		"with its place in the booking's history. The reorder injector (out_of_order) sends the confirmation back " +
		"unhandled for a moment, so the release overtakes it, as a redelivery, a second relay or a second instance " +
		"can. Both consumers keep an inbox, so each event takes effect once. The naive projection applies whatever " +
		"arrives: it ends \"confirmed\" — a booking that was released shows as taken. The versioned one " +
		"(events.History) sees the release is early (its place is 3, the booking's version 1), parks it, and applies " +
		"it right after the confirmation: it ends \"released\", the ordered fold of its events.",
	Columns: []Column{
		{Key: "deliveries", Label: "deliveries"},
		{Key: "effects", Label: "events applied"},
		{Key: "parked", Label: "parked until their turn"},
		{Key: "out_of_place", Label: "applied out of order", Bad: true},
		{Key: "wrong", Label: "projections wrong", Bad: true},
	},
	Code: []CodeRef{
		{Path: "internal/events/event.go", Text: "SET last_seq = s.last_seq + 1",
			Says: "each event's place in its aggregate, handed out in the writer's transaction"},
		{Path: "internal/events/history.go", Text: "case m.Seq > version+1:",
			Says: "early: parked (kept, not applied, not dropped) until its predecessor is applied"},
		{Path: "internal/events/history.go", Text: "for { // its parked successors, while the next one is there",
			Says: "the predecessor applies the parked successors that are now next, in its transaction"},
		{Path: "internal/labs/ordering.go", Text: "SET version = h.version + 1, -- its place is where it arrived, not where it belongs",
			Says: "naiveProjection: the last arrival wins"},
	},
	run: runOrdering,
}

func runOrdering(ctx context.Context, e *env) ([]Variant, error) {
	naive, err := e.ordering(ctx, "naive", func(name string) events.Consumer { return naiveProjection{name: name} })
	if err != nil {
		return nil, err
	}
	versioned, err := e.ordering(ctx, "versioned", func(name string) events.Consumer { return labHistory{name: name} })
	if err != nil {
		return nil, err
	}
	naive.Title = "Apply whatever arrives (last arrival wins)"
	versioned.Title = "Check the place, park an early event (events.History)"
	return []Variant{naive, versioned}, nil
}

// ordering delivers the schedule to one consumer: e1, e2 sent back
// unhandled (the injector's out_of_order), e3, then e2 again — the order a
// transport that redelivers hands them over in.
func (e *env) ordering(ctx context.Context, variant string, consumer func(name string) events.Consumer) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Broken: variant == "naive", Counts: map[string]int{}}
	key := e.name("ordering", variant, "booking:1") // the aggregate; its name carries the run
	types := []string{events.TypeBookingHeld, events.TypeBookingConfirmed, events.TypeBookingReleased}
	msgs := make([]events.Message, len(types))
	label := map[uuid.UUID]string{}
	for i, typ := range types {
		msgs[i] = events.Message{ID: uuid.New(), Type: typ, Key: key, Seq: int64(i + 1),
			Payload: json.RawMessage(`{}`), CreatedAt: time.Now()}
		label[msgs[i].ID] = fmt.Sprintf("e%d %s", i+1, events.HistoryState(typ))
	}
	t.say("producer", "committed e1 held, e2 confirmed, e3 released: places 1, 2, 3 of the booking")
	h := events.NewHandler(e.lab, consumer(e.name("ordering", variant)),
		events.HandlerConfig{Transport: "lab", Instance: "lab", Logger: e.cfg.Logger})
	schedule := []struct {
		m        events.Message
		sentBack bool
	}{{msgs[0], false}, {msgs[1], true}, {msgs[2], false}, {msgs[1], false}}
	var before int64 // the projection's version before each delivery
	for attempt, s := range schedule {
		v.Counts["deliveries"]++
		d := events.Delivery{Message: s.m, Attempt: attempt + 1}
		if s.sentBack {
			d.Injected = events.OutOfOrder
			h.Defer(ctx, d, "sent back unhandled by the lab's reorder injector")
			t.say("transport", "%s: sent back unhandled for a moment (out_of_order) — the events behind it overtake it", label[s.m.ID])
			continue
		}
		if _, err := h.Handle(ctx, d); err != nil {
			return v, err
		}
		var version int64
		var state *string
		var parked int
		err := e.lab.QueryRow(ctx, `
			SELECT coalesce(h.version, 0), h.state,
			       (SELECT count(*) FROM history_parked p WHERE p.key = $1)
			  FROM (SELECT 1) AS one
			  LEFT JOIN histories h ON h.key = $1`, key).Scan(&version, &state, &parked)
		if err != nil {
			return v, fmt.Errorf("labs: ordering: %w", err)
		}
		switch {
		case parked > 0:
			v.Counts["parked"]++
			t.say("consumer", "%s arrives at version %d: early, parked until its turn", label[s.m.ID], version)
		case version > before+1:
			t.say("consumer", "%s applied, then the parked events now next: the booking is %q at version %d", label[s.m.ID], database.Deref(state), version)
		default:
			t.say("consumer", "%s applied: the booking is %q at version %d", label[s.m.ID], database.Deref(state), version)
		}
		before = version
	}
	// What the consumer applied, place by place, against the order the
	// events were committed in: the ordered fold the projection must equal.
	rows, err := e.lab.Query(ctx, `
		SELECT seq, event_id
		  FROM history_events
		 WHERE key = $1
		 ORDER BY seq`, key)
	if err != nil {
		return v, fmt.Errorf("labs: ordering: %w", err)
	}
	var applied []string
	var place int64
	var id uuid.UUID
	_, err = pgx.ForEachRow(rows, []any{&place, &id}, func() error {
		v.Counts["effects"]++
		applied = append(applied, label[id])
		if msgs[place-1].ID != id {
			v.Counts["out_of_place"]++
		}
		return nil
	})
	if err != nil {
		return v, fmt.Errorf("labs: ordering: %w", err)
	}
	var state *string
	if err := e.lab.QueryRow(ctx, `SELECT state FROM histories WHERE key = $1`, key).Scan(&state); err != nil {
		return v, fmt.Errorf("labs: ordering: %w", err)
	}
	fold := events.HistoryState(types[len(types)-1])
	if database.Deref(state) != fold {
		v.Counts["wrong"] = 1
		t.wrong("result", "applied as %s: the booking shows %q, its events say %q", strings.Join(applied, ", "), database.Deref(state), fold)
	} else {
		t.say("result", "applied as %s: the booking shows %q, the ordered fold of its events", strings.Join(applied, ", "), fold)
	}
	v.Verdict = fmt.Sprintf("the booking ends %q (its events say %q)", database.Deref(state), fold)
	v.Timeline = t.list()
	return v, nil
}

// labHistory is the app's history consumer unchanged, under a name of the
// run's (its inbox rows and deliveries are the run's scratch).
type labHistory struct {
	events.History
	name string
}

func (c labHistory) Name() string { return c.name }

// naiveProjection applies every event as it arrives: the booking's state
// is whatever the last arrival says, its place the next number.
type naiveProjection struct{ name string }

func (c naiveProjection) Name() string { return c.name }

func (c naiveProjection) Apply(ctx context.Context, tx pgx.Tx, m events.Message) error {
	var place int64
	err := tx.QueryRow(ctx, `
		INSERT INTO histories AS h (key, version, state)
		VALUES ($1, 1, $2)
		    ON CONFLICT (key) DO UPDATE
		   SET version = h.version + 1, -- its place is where it arrived, not where it belongs
		       state = excluded.state,
		       updated_at = now()
		RETURNING version`, m.Key, events.HistoryState(m.Type)).Scan(&place)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO history_events (key, seq, event_id, type)
		VALUES ($1, $2, $3, $4)`, m.Key, place, m.ID, m.Type)
	return err
}
