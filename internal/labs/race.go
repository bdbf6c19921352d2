package labs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/slots"
)

// The race lab: N users try to book one slot at the same instant, each in
// its own transaction, and the result says who won, how long each waited
// and what the database did. It is the contention story made visible.
//
// The lab works on its own data: schema race_lab (migration 00052) has
// racers, slots and bookings of the same shape as the business tables, and
// every connection of a race runs with search_path = race_lab, so the very
// booking code (slots.Store.Book, BookWithRowLock) books the lab's slots — never a slot of
// the demo week, a customer's booking, or a row of users.

const (
	// RaceSchema holds the lab's racers, slots and bookings.
	RaceSchema = "race_lab"
	// RaceResource is the resource of the lab's fresh slots.
	RaceResource = "Race lab"
	// RacerPrefix names the lab's racers: racer-01 … racer-64, fixed rows
	// of race_lab.racers, each a different user as in a real race.
	RacerPrefix = "racer-"
	MinRacers   = 2
	MaxRacers   = 64
	// MaxThink bounds the pause a racer takes between deciding and writing.
	MaxThink = 500 * time.Millisecond
)

// ErrInvalidRace is a race request out of bounds.
var ErrInvalidRace = errors.New("labs: invalid race")

// RaceRequest describes one race.
type RaceRequest struct {
	// SlotID is the slot to race for; 0 means a fresh slot made for this race.
	SlotID   int64
	Racers   int
	Strategy Strategy
	// Think widens the window between check and write (see book).
	Think time.Duration
}

// Validate reports what is wrong with r, wrapping ErrInvalidRace.
func (r RaceRequest) Validate() error {
	switch {
	case r.Racers < MinRacers || r.Racers > MaxRacers:
		return fmt.Errorf("%w: the number of racers must be from %d to %d", ErrInvalidRace, MinRacers, MaxRacers)
	case r.Think < 0 || r.Think > MaxThink:
		return fmt.Errorf("%w: the think time must be from 0 to %d ms", ErrInvalidRace, MaxThink.Milliseconds())
	case r.SlotID < 0:
		return fmt.Errorf("%w: the slot must be a fresh one or one of the lab's", ErrInvalidRace)
	}
	_, err := ParseStrategy(string(r.Strategy))
	return err
}

// Racer outcomes.
const (
	Won     = "won"
	Refused = "refused" // slots.ErrSlotTaken: a clean "no"
	Failed  = "failed"  // any other error: a bug or an outage, never expected
)

// RacerResult is one racer's attempt.
type RacerResult struct {
	Racer     int    `json:"racer"` // 1-based
	User      string `json:"user"`
	Outcome   string `json:"outcome"`
	BookingID int64  `json:"booking_id,omitempty"`
	Trace     Trace  `json:"trace"`
	// Took is the whole attempt: from the start signal to commit or rollback.
	Took time.Duration `json:"took_ns"`
	// Finished is the order in which attempts ended, from 1.
	Finished int    `json:"finished"`
	Error    string `json:"error,omitempty"`
}

// RaceResult is what a race did.
type RaceResult struct {
	Request RaceRequest `json:"request"`
	// Attempts, one per racer, in finishing order.
	Attempts []RacerResult `json:"attempts"`
	// Counts of outcomes, and of refusals only the unique index made.
	Won, Refused, Failed, ConstraintHits int
	// Elapsed is from the start signal to the last attempt's end.
	Elapsed time.Duration `json:"elapsed_ns"`
	// After the race: the slot as committed, and invariant 3 over all slots.
	Slot       slots.Slot        `json:"slot"`
	Violations []slots.Violation `json:"violations"`
}

// Verdict is the race in one line.
func (r RaceResult) Verdict() string {
	n := len(r.Attempts)
	var s string
	switch r.Won {
	case 0:
		s = fmt.Sprintf("No winner: all %d refused", r.Refused)
		if r.Refused == n {
			s += " — the slot was already booked before the race"
		}
	case 1:
		s = fmt.Sprintf("1 winner, %d refused", r.Refused)
	default:
		s = fmt.Sprintf("DOUBLE BOOKING: %d winners, %d refused", r.Won, r.Refused)
	}
	switch {
	case r.Refused == 0:
	case r.ConstraintHits == 0:
		s += ": none reached the unique index"
	case r.ConstraintHits == 1:
		s += ": 1 was stopped only by the unique index"
	default:
		s += fmt.Sprintf(": %d were stopped only by the unique index", r.ConstraintHits)
	}
	if r.Failed > 0 {
		s += fmt.Sprintf("; %d failed with an error", r.Failed)
	}
	return s
}

// Lab runs races. One race at a time per process: each racer holds a
// connection of its own, and a person clicking twice should not double
// what the lab asks of the database.
type RaceLab struct {
	pool *pgxpool.Pool
	turn chan struct{} // a one-slot semaphore: holding it is "my turn"
}

// NewLab returns a Lab whose races connect like pool, in RaceSchema.
func NewRaceLab(pool *pgxpool.Pool) *RaceLab {
	return &RaceLab{pool: pool, turn: make(chan struct{}, 1)}
}

// Race runs r: it makes the racers (and a fresh slot if asked), opens one
// connection per racer, releases every racer at once with close(start),
// and reports each attempt and invariant 3 afterwards. It returns
// ErrInvalidRace or ErrUnknownStrategy for a bad request, slots.ErrNotFound for
// an unknown slot.
//
// Racers get their own connections, outside the pool, so that they contend
// for the slot's row rather than queue for a pooled connection: a race of 64
// on a pool of 20 would otherwise mostly measure the pool.
func (l *RaceLab) Race(ctx context.Context, r RaceRequest) (RaceResult, error) {
	if err := r.Validate(); err != nil {
		return RaceResult{}, err
	}
	select {
	case l.turn <- struct{}{}:
		defer func() { <-l.turn }()
	case <-ctx.Done():
		return RaceResult{}, ctx.Err()
	}

	// One connection per racer, and one more (the referee) that sets the
	// race up and reads the outcome, all in the lab's schema.
	all, err := l.connect(ctx, r.Racers+1)
	if err != nil {
		return RaceResult{}, err
	}
	defer func() {
		for _, c := range all {
			c.Close(context.Background())
		}
	}()
	referee, conns := all[0], all[1:]
	store := slots.NewStore(referee)
	if r.SlotID == 0 {
		if r.SlotID, err = freshSlot(ctx, referee); err != nil {
			return RaceResult{}, err
		}
	} else if _, err := store.Get(ctx, r.SlotID); err != nil {
		return RaceResult{}, err // ErrNotFound: not one of the lab's slots
	}
	racers, err := racersOf(ctx, referee, r.Racers)
	if err != nil {
		return RaceResult{}, err
	}

	res := RaceResult{Request: r, Attempts: make([]RacerResult, r.Racers)}
	start := make(chan struct{})
	var finished atomic.Int32
	var wg sync.WaitGroup
	for i := range r.Racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr := &res.Attempts[i] // each goroutine writes only its own element
			rr.Racer, rr.User = i+1, racers[i].name
			<-start
			t0 := time.Now()
			err := pgx.BeginFunc(ctx, conns[i], func(tx pgx.Tx) error {
				b, tr, err := book(ctx, tx, store, r.Strategy, r.SlotID, racers[i].id, r.Think)
				rr.Trace, rr.BookingID = tr, b.ID
				return err
			})
			rr.Took = time.Since(t0)
			rr.Finished = int(finished.Add(1))
			switch {
			case err == nil:
				rr.Outcome = Won
			case errors.Is(err, slots.ErrSlotTaken):
				rr.Outcome = Refused
			default:
				rr.Outcome, rr.Error = Failed, err.Error()
			}
		}()
	}
	t0 := time.Now()
	close(start) // every racer at once
	wg.Wait()
	res.Elapsed = time.Since(t0)

	slices.SortFunc(res.Attempts, func(a, b RacerResult) int { return a.Finished - b.Finished })
	for _, rr := range res.Attempts {
		switch rr.Outcome {
		case Won:
			res.Won++
		case Refused:
			res.Refused++
		default:
			res.Failed++
		}
		if rr.Trace.ConstraintHit {
			res.ConstraintHits++
		}
	}
	if res.Slot, err = store.Get(ctx, r.SlotID); err != nil {
		return res, err
	}
	if res.Violations, err = store.CheckInvariant(ctx); err != nil {
		return res, err
	}
	return res, nil
}

type racer struct {
	id   int64
	name string
}

// racersOf returns the first n of the lab's fixed racers, in order.
func racersOf(ctx context.Context, db database.DBTX, n int) ([]racer, error) {
	rows, err := db.Query(ctx, `
		SELECT id, name
		  FROM racers
		 ORDER BY id
		 LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("labs: race: racers: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (racer, error) {
		var r racer
		return r, row.Scan(&r.id, &r.name)
	})
	if err != nil {
		return nil, fmt.Errorf("labs: race: racers: %w", err)
	}
	if len(list) != n {
		return nil, fmt.Errorf("labs: race: found %d of %d racers", len(list), n)
	}
	return list, nil
}

// freshSlot adds the next hour to the lab's own resource.
func freshSlot(ctx context.Context, db database.DBTX) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `
		INSERT INTO slots (resource, starts_at, ends_at)
		SELECT $1, next.t, next.t + interval '1 hour'
		  -- the hour after the lab's last slot, and never one that has begun
		  FROM (SELECT greatest(max(starts_at) + interval '1 hour', date_trunc('hour', now()) + interval '1 hour') AS t
		          FROM slots
		         WHERE resource = $1) AS next
		RETURNING id`, RaceResource).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("labs: race: fresh slot: %w", err)
	}
	return id, nil
}

// RecentLabSlots returns the lab's latest slots, newest first, to race for
// again (a booked one shows what a loser sees).
func (l *RaceLab) RecentLabSlots(ctx context.Context, limit int) ([]slots.Slot, error) {
	rows, err := l.pool.Query(ctx, `
		SELECT id, resource, starts_at, ends_at, status, booking_id, deposit_cents, held_until
		  FROM race_lab.slots
		 ORDER BY starts_at DESC
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("labs: lab slots: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[slots.Slot])
	if err != nil {
		return nil, fmt.Errorf("labs: lab slots: %w", err)
	}
	return list, nil
}

// connect opens n connections like the pool's but in the lab's schema, all
// before the race starts.
func (l *RaceLab) connect(ctx context.Context, n int) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := l.pool.Config().ConnConfig.Copy()
			cfg.RuntimeParams["search_path"] = RaceSchema // unqualified names are the lab's tables
			conns[i], errs[i] = pgx.ConnectConfig(ctx, cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
		return nil, fmt.Errorf("labs: race: connect racers: %w", err)
	}
	return conns, nil
}
