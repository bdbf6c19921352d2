package labs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Lab 6: a unique index that allows NULL. In a unique index two NULLs are
// not equal, so a row whose key column is NULL never collides with
// anything. An index meant to say "one confirmed booking per slot" through
// a column that some writer leaves NULL says nothing about that writer's
// rows. A partial unique index keyed on the status itself has no such
// column to forget.
var nullLab = &Lab{
	Number: 6,
	Name:   "null-unique",
	Title:  "A unique index that allows NULL vs the partial unique index",
	Summary: "A unique index over a column that may be NULL lets duplicate bookings through; a partial unique " +
		"index on the status refuses them.",
	Lesson: "Bookings mark a confirmed booking with live = TRUE (NULL otherwise, so that cancelled bookings do not " +
		"collide), and UNIQUE (slot_id, live) is meant to allow one confirmed booking per slot. The booking form sets " +
		"live; a bulk import written later confirms bookings and leaves live NULL. Two imported confirmations of an " +
		"already booked slot slip past the index — NULLs are distinct — and the slot has three confirmed bookings; " +
		"only the booking form's own second attempt is stopped. The app's index, UNIQUE (slot_id) WHERE status = " +
		"'CONFIRMED', is keyed on the status itself: every writer's second confirmation is refused (23505).",
	Columns: []Column{
		{Key: "executions", Label: "confirmations tried"},
		{Key: "effects", Label: "confirmed bookings on the slot"},
		{Key: "duplicates", Label: "double bookings", Bad: true},
		{Key: "refused", Label: "refused by the index (23505)"},
	},
	Code: []CodeRef{
		{Path: "migrations/00001_users_policies_slots.sql", Text: "CREATE UNIQUE INDEX bookings_one_confirmed_per_slot ON bookings (slot_id) WHERE status = 'CONFIRMED';",
			Says: "the app's last line of defence: the partial unique index on the status"},
		{Path: "migrations/00040_labs.sql", Text: "CONSTRAINT bookings_plain_unique_slot_live_key UNIQUE (run_id, slot_id, live)",
			Says: "the broken index: it holds only while every writer sets live"},
	},
	run: runNull,
}

// confirmation is one attempt of the schedule: who confirms, and whether
// that writer sets live.
type confirmation struct {
	writer string
	live   *bool
}

func runNull(ctx context.Context, e *env) ([]Variant, error) {
	yes := true
	schedule := []confirmation{
		{"booking form", &yes},
		{"bulk import", nil}, // forgets live: NULL
		{"bulk import", nil},
		{"booking form", &yes}, // the form's own double-click
	}
	broken, err := e.confirmAll(ctx, "broken", "bookings_plain_unique", schedule)
	if err != nil {
		return nil, err
	}
	correct, err := e.confirmAll(ctx, "correct", "bookings_partial_unique", schedule)
	if err != nil {
		return nil, err
	}
	broken.Title = "UNIQUE (slot_id, live), live NULL unless set"
	correct.Title = "UNIQUE (slot_id) WHERE status = 'CONFIRMED'"
	return []Variant{broken, correct}, nil
}

// confirmAll confirms a booking of one slot for each entry of schedule, each
// in its own transaction, in table.
func (e *env) confirmAll(ctx context.Context, variant, table string, schedule []confirmation) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Broken: variant == "broken", Counts: map[string]int{}}
	const slot = 1
	for _, c := range schedule {
		v.Counts["executions"]++
		_, err := e.lab.Exec(ctx, `
			INSERT INTO `+table+` (run_id, slot_id, status, live, writer)
			VALUES ($1, $2, 'CONFIRMED', $3, $4)`, e.run, slot, c.live, c.writer)
		var pgErr *pgconn.PgError
		live := "NULL"
		if c.live != nil {
			live = "TRUE"
		}
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "23505":
			v.Counts["refused"]++
			t.say(c.writer, "confirm (live %s): refused — %s", live, pgErr.ConstraintName)
		case err != nil:
			return v, fmt.Errorf("null-unique: confirm: %w", err)
		default:
			t.say(c.writer, "confirm (live %s): committed", live)
		}
	}
	var confirmed int
	err := e.lab.QueryRow(ctx, `
		SELECT count(*)
		  FROM `+table+`
		 WHERE run_id = $1
		   AND slot_id = $2
		   AND status = 'CONFIRMED'`, e.run, slot).Scan(&confirmed)
	if err != nil {
		return v, fmt.Errorf("null-unique: count: %w", err)
	}
	v.Counts["effects"] = confirmed
	v.Counts["duplicates"] = max(0, confirmed-1)
	if v.Counts["duplicates"] > 0 {
		t.wrong("result", "the slot has %s", plural(v.Counts["effects"], "confirmed booking"))
	}
	v.Verdict = plural(v.Counts["effects"], "confirmed booking") + " on one slot"
	v.Timeline = t.list()
	return v, nil
}
