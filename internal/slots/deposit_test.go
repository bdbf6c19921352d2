package slots_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/payments"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/workflow"
)

// The payments client's patience: modes that never answer cost one
// impatient timeout; modes that answer get a patient client, so a loaded
// machine cannot turn an answer into a timeout.
const (
	impatient = 300 * time.Millisecond
	patient   = 10 * time.Second
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// saga is one database with the demo data, the payments fake over real
// HTTP, and the deposit saga on an engine.
type saga struct {
	db       *testdb.DB
	pay      *paymentsfake.Payments
	payURL   string
	engine   *workflow.Engine
	deposits *slots.Deposits
	booker   *slots.Booker
	users    []int64 // alice, bob, carol
	slotIDs  []int64 // the deposit slots, in time order
}

func newSaga(t *testing.T, timeout, hold time.Duration) *saga {
	t.Helper()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	s := &saga{db: db}
	s.pay = paymentsfake.New(db.Pool, paymentsfake.Options{Logger: quiet})
	srv := httptest.NewServer(s.pay.Handler())
	t.Cleanup(func() { s.pay.Close(); srv.Close() })
	s.payURL = srv.URL
	s.engine, s.deposits, s.booker = s.process(t, nil, timeout, hold)
	rows, _ := db.Pool.Query(ctx, `SELECT id FROM users WHERE name IN ('alice', 'bob', 'carol') ORDER BY name`)
	s.users, _ = pgx.CollectRows(rows, pgx.RowTo[int64])
	rows, _ = db.Pool.Query(ctx, `SELECT id FROM slots WHERE deposit_cents IS NOT NULL ORDER BY starts_at`)
	s.slotIDs, _ = pgx.CollectRows(rows, pgx.RowTo[int64])
	if len(s.users) != 3 || len(s.slotIDs) < 50 {
		t.Fatalf("fixture: users %v, %d deposit slots", s.users, len(s.slotIDs))
	}
	return s
}

// process is what one app process has: an engine (with its crash switch),
// the deposit saga registered on it, a payments client, a booker.
func (s *saga) process(t *testing.T, sw *crash.Switch, timeout, hold time.Duration) (*workflow.Engine, *slots.Deposits, *slots.Booker) {
	t.Helper()
	pay := payments.NewHTTPClient(s.payURL, timeout)
	t.Cleanup(pay.CloseIdleConnections)
	engine := workflow.NewEngine(s.db.Pool, workflow.Config{Lease: 30 * time.Second, Crash: sw, Logger: quiet})
	outbox := events.NewWriter(sw)
	d := slots.NewDeposits(engine, pay, outbox, hold)
	return engine, d, slots.NewBooker(s.db.Pool, outbox).WithDeposits(d)
}

func (s *saga) setFault(t *testing.T, change func(*fault.Fault)) {
	t.Helper()
	f := fault.Default()
	change(&f)
	if _, err := s.pay.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

func (s *saga) setMode(t *testing.T, mode fault.Mode) {
	t.Helper()
	s.setFault(t, func(f *fault.Fault) { f.Mode, f.SlowMS = mode, 1000 })
}

func bookSaga(ctx context.Context, b *slots.Booker, slotID, userID int64, key string) (slots.Booking, error) {
	return b.Book(ctx, slots.BookSlot{SlotID: slotID, UserID: userID, RequestKey: key, Actor: "test " + key}, workflow.Hooks[slots.Booking]{})
}

func release(ctx context.Context, b *slots.Booker, bookingID, userID int64, key string) (slots.Booking, error) {
	return b.Release(ctx, slots.ReleaseBooking{BookingID: bookingID, UserID: userID, RequestKey: key, Actor: "test " + key},
		workflow.Hooks[slots.Booking]{})
}

// recoverAll runs a recovery loop on a fresh engine (a restarted process)
// with its clock a minute ahead — every lease and deadline over, no hold's
// time up — until no operation is live, or fails the test.
func (s *saga) recoverAll(t *testing.T) {
	t.Helper()
	engine, _, _ := s.process(t, nil, patient, 0)
	cfg := recovery.DefaultConfig()
	cfg.ClockSkew, cfg.PollInterval, cfg.MaxPolls, cfg.Logger = 0, 50*time.Millisecond, 3, quiet
	loop := recovery.New(engine, cfg)
	for _, typ := range engine.Types() {
		loop.Register(typ, engine)
	}
	ctx := context.Background()
	for range 40 {
		engine.Clock().Set(time.Now().Add(time.Minute))
		if _, err := loop.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		var live int
		s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')`).Scan(&live)
		if live == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond) // a slow charge completes in its own time
	}
	t.Fatal("operations still live after 40 recovery passes")
}

// slotAndBooking is a slot's status and the status of the booking it
// names, or of booking bookingID when it names none.
func (s *saga) state(t *testing.T, slotID, bookingID int64) (slot, booking string) {
	t.Helper()
	err := s.db.Pool.QueryRow(context.Background(), `
		SELECT s.status, coalesce((SELECT status FROM bookings WHERE id = coalesce(s.booking_id, $2)), '')
		  FROM slots s WHERE s.id = $1`, slotID, bookingID).Scan(&slot, &booking)
	if err != nil {
		t.Fatal(err)
	}
	return slot, booking
}

func (s *saga) assertInvariants(t *testing.T) {
	t.Helper()
	r, err := invariants.Check(context.Background(), s.db.Pool, invariants.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("invariants broken: %+v", r.Violations)
	}
}

// The request's own outcome for each payments mode: only a definite refusal
// releases the hold; every unknown keeps it, the booking PENDING.
func TestDepositOutcomeForEachPaymentsMode(t *testing.T) {
	t.Parallel()
	s := newSaga(t, impatient, 0)
	ctx := context.Background()
	for i, tc := range []struct {
		mode           fault.Mode
		booking, slot  string
		op, charge     string
		patientClient  bool
		definiteAnswer bool
	}{
		{fault.ModeOK, slots.BookingConfirmed, slots.StatusBooked, workflow.StatusSucceeded, workflow.StepDone, true, true},
		{fault.ModeReject, slots.BookingFailed, slots.StatusAvailable, workflow.StatusFailed, workflow.StepFailed, true, true},
		{fault.ModeError, slots.BookingPending, slots.StatusHeld, workflow.StatusInProgress, workflow.StepUnknown, true, false},
		{fault.ModeDrop, slots.BookingPending, slots.StatusHeld, workflow.StatusInProgress, workflow.StepUnknown, false, false},
		{fault.ModeLostResponse, slots.BookingPending, slots.StatusHeld, workflow.StatusInProgress, workflow.StepUnknown, false, false},
		{fault.ModeSlow, slots.BookingPending, slots.StatusHeld, workflow.StatusInProgress, workflow.StepUnknown, false, false},
	} {
		b := s.booker
		if tc.patientClient {
			_, _, b = s.process(t, nil, patient, 0)
		}
		s.setMode(t, tc.mode)
		slotID := s.slotIDs[i]
		bk, err := bookSaga(ctx, b, slotID, s.users[0], fmt.Sprintf("k-%s", tc.mode))
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		charge, _ := bk.Operation.Step(slots.StepChargeDeposit)
		slot, _ := s.state(t, slotID, bk.ID)
		if bk.Status != tc.booking || slot != tc.slot || bk.Operation.Status != tc.op || charge.State != tc.charge {
			t.Errorf("%s: booking %s, slot %s, operation %s, charge %s; want %s %s %s %s",
				tc.mode, bk.Status, slot, bk.Operation.Status, charge.State, tc.booking, tc.slot, tc.op, tc.charge)
		}
		if bk.DepositCents == nil || *bk.DepositCents != demo.DepositCents {
			t.Errorf("%s: deposit %v", tc.mode, bk.DepositCents)
		}
		// Another booker meets the hold, and is told until when.
		if slot == slots.StatusHeld {
			_, err := bookSaga(ctx, s.booker, slotID, s.users[1], "bob-"+string(tc.mode))
			var held *slots.SlotHeldError
			if !errors.As(err, &held) || !workflow.IsRefused(err) || held.Until.Before(time.Now()) {
				t.Errorf("%s: bob booking a held slot: %v", tc.mode, err)
			}
		}
	}
	s.setMode(t, fault.ModeOK)
	s.recoverAll(t)
	// After recovery: each unknown charge found out — every one applied but
	// error and drop (never charged: recovery charged them, same key).
	for i := range 6 {
		slot, booking := s.state(t, s.slotIDs[i], 0)
		want := slots.StatusBooked
		if i == 1 {
			want = slots.StatusAvailable
		}
		if slot != want {
			t.Errorf("slot %d after recovery: %s (%s), want %s", i, slot, booking, want)
		}
	}
	s.assertInvariants(t)
}

// Every crash point of both workflows × every payments mode: the request
// dies there (or the mode leaves its outcome unknown), the fault heals, a
// restarted process recovers — and every booking ends in a state that
// agrees with the payments service: at most one charge and one refund per
// booking, a hold released only for a charge that does not exist.
func TestDepositCrashPointsTimesPaymentsModes(t *testing.T) {
	t.Parallel()
	modes := []fault.Mode{fault.ModeOK, fault.ModeReject, fault.ModeError, fault.ModeDrop, fault.ModeLostResponse, fault.ModeSlow}
	var points []crash.Point
	for _, p := range slots.DepositCrashPoints {
		if !slices.Contains(points, p) {
			points = append(points, p)
		}
	}
	cancelPoint := func(p crash.Point) bool {
		for _, step := range []string{slots.StepRequestCancel, slots.StepRefundDeposit, slots.StepReleaseSlot} {
			if p == crash.Point("before_"+step) || p == crash.Point("after_"+step) {
				return true
			}
		}
		return false
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			s := newSaga(t, impatient, 0)
			ctx := context.Background()
			_, _, healthy := s.process(t, nil, patient, 0)
			type tried struct {
				point   crash.Point
				slotID  int64
				cancels bool
			}
			var cases []tried
			for i, p := range points {
				slotID := s.slotIDs[i]
				sw := crash.New(slots.DepositCrashPoints, quiet)
				if err := sw.Arm(crash.Setting{At: p, Mode: crash.Abandon, Once: true}); err != nil {
					t.Fatal(err)
				}
				_, _, dying := s.process(t, sw, impatient, 0)
				if mode == fault.ModeOK || mode == fault.ModeReject || mode == fault.ModeError {
					_, _, dying = s.process(t, sw, patient, 0) // they answer: let them
				}
				key := fmt.Sprintf("%s-%s", mode, p)
				run := func(f func()) {
					defer func() {
						if r := recover(); r != nil && !errors.Is(asError(r), errAbort) {
							panic(r)
						}
					}()
					f()
				}
				c := tried{point: p, slotID: slotID, cancels: cancelPoint(p)}
				if c.cancels {
					// Booked while all is well; the cancellation meets the fault.
					s.setMode(t, fault.ModeOK)
					bk, err := bookSaga(ctx, healthy, slotID, s.users[0], key+"-book")
					if err != nil || bk.Status != slots.BookingConfirmed {
						t.Fatalf("%s: booking before the cancellation: %+v %v", p, bk, err)
					}
					s.setMode(t, mode)
					run(func() { release(ctx, dying, bk.ID, s.users[0], key) })
				} else {
					s.setMode(t, mode)
					run(func() { bookSaga(ctx, dying, slotID, s.users[0], key) })
				}
				cases = append(cases, c)
			}
			s.setMode(t, fault.ModeOK) // heal
			s.recoverAll(t)

			for _, c := range cases {
				slot, booking := s.state(t, c.slotID, 0)
				var charges, refunds int
				s.db.Pool.QueryRow(ctx, `
					SELECT count(*) FILTER (WHERE kind = 'charge'), count(*) FILTER (WHERE kind = 'refund')
					  FROM fake_payments.ledger
					 WHERE booking_id IN (SELECT id FROM bookings WHERE slot_id = $1)`, c.slotID).Scan(&charges, &refunds)
				switch {
				case charges > 1 || refunds > 1 || refunds > charges:
					t.Errorf("%s: %d charges, %d refunds", c.point, charges, refunds)
				case slot == slots.StatusHeld:
					t.Errorf("%s: still HELD after the fault healed and recovery ran", c.point)
				case slot == slots.StatusBooked && (charges != 1 || refunds != 0):
					t.Errorf("%s: BOOKED with %d charges, %d refunds", c.point, charges, refunds)
				case slot == slots.StatusAvailable && charges != refunds:
					t.Errorf("%s: free again with %d charges, %d refunds (booking %s)", c.point, charges, refunds, booking)
				}
				// Only a refused charge (or none sent) leaves the slot free
				// without a cancellation.
				if !c.cancels && slot == slots.StatusAvailable && mode != fault.ModeReject && c.point != "after_hold" {
					t.Errorf("%s: a %s charge released the hold", c.point, mode)
				}
				if c.cancels && mode != fault.ModeReject && c.point != "after_"+slots.StepRequestCancel && slot != slots.StatusAvailable {
					t.Errorf("%s: the cancellation left the slot %s", c.point, slot)
				}
			}
			s.assertInvariants(t)
		})
	}
}

var errAbort = errors.New("abort")

// asError maps the crash switch's abandon panic to errAbort.
func asError(r any) error {
	if err, ok := r.(error); ok && err.Error() == "net/http: abort Handler" {
		return errAbort
	}
	return fmt.Errorf("%v", r)
}

// A hold's timer is not a licence to release it: with the charge RUNNING,
// or its truth not learnable, the hold outlives held_until and stays. Only
// when the charge is known never to have been made does the hold expire.
func TestAHoldWithAnUnknownChargeOutlivesItsTimer(t *testing.T) {
	t.Parallel()
	s := newSaga(t, impatient, time.Second) // holds meant to last a second
	ctx := context.Background()
	engine, _, _ := s.process(t, nil, impatient, time.Second)
	cfg := recovery.DefaultConfig()
	cfg.ClockSkew, cfg.PollInterval, cfg.MaxPolls, cfg.Logger = 0, 20*time.Millisecond, 1, quiet
	loop := recovery.New(engine, cfg)
	for _, typ := range engine.Types() {
		loop.Register(typ, engine)
	}
	recoverAnHourLater := func() {
		for range 3 {
			engine.Clock().Set(time.Now().Add(time.Hour)) // the hold's second is long over
			if _, err := loop.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	// RUNNING: the charge is accepted and still running.
	s.setFault(t, func(f *fault.Fault) { f.Mode, f.SlowMS = fault.ModeSlow, 60_000 })
	running, err := bookSaga(ctx, s.booker, s.slotIDs[0], s.users[0], "running")
	if err != nil || running.Status != slots.BookingPending {
		t.Fatalf("running: %+v %v", running, err)
	}
	// Unreachable: the charge was made (lost answer) and no status query gets through.
	s.setFault(t, func(f *fault.Fault) { f.Mode = fault.ModeLostResponse })
	unreachable, err := bookSaga(ctx, s.booker, s.slotIDs[1], s.users[0], "unreachable")
	if err != nil || unreachable.Status != slots.BookingPending {
		t.Fatalf("unreachable: %+v %v", unreachable, err)
	}
	// Known never made: the call was dropped before it arrived.
	s.setFault(t, func(f *fault.Fault) { f.Mode = fault.ModeDrop })
	dropped, err := bookSaga(ctx, s.booker, s.slotIDs[2], s.users[0], "dropped")
	if err != nil || dropped.Status != slots.BookingPending {
		t.Fatalf("dropped: %+v %v", dropped, err)
	}

	// Nobody can ask, and the app does not believe a repeat is safe: nothing
	// is learned, nothing sent again.
	s.setFault(t, func(f *fault.Fault) { f.Mode, f.StatusMode = fault.ModeDrop, fault.StatusError })
	if _, err := recovery.SetBelief(ctx, s.db.Pool, "payments", false, "the test"); err != nil {
		t.Fatal(err)
	}
	recoverAnHourLater()
	for _, bk := range []slots.Booking{running, unreachable, dropped} {
		if slot, booking := s.state(t, bk.SlotID, bk.ID); slot != slots.StatusHeld || booking != slots.BookingPending {
			t.Errorf("booking %d with its charge's truth unknowable: slot %s, booking %s; want the hold kept", bk.ID, slot, booking)
		}
	}

	// Status queries answer again; calls are still dropped.
	s.setFault(t, func(f *fault.Fault) { f.Mode = fault.ModeDrop })
	recoverAnHourLater()
	if slot, booking := s.state(t, running.SlotID, running.ID); slot != slots.StatusHeld || booking != slots.BookingPending {
		t.Errorf("RUNNING charge: slot %s, booking %s; want the hold kept past its time", slot, booking)
	}
	if slot, booking := s.state(t, unreachable.SlotID, unreachable.ID); slot != slots.StatusBooked || booking != slots.BookingConfirmed {
		t.Errorf("a charge applied though its answer was lost: slot %s, booking %s; want it BOOKED", slot, booking)
	}
	if slot, booking := s.state(t, dropped.SlotID, dropped.ID); slot != slots.StatusAvailable || booking != slots.BookingFailed {
		t.Errorf("a charge known never made, its hold's time up: slot %s, booking %s; want the hold expired", slot, booking)
	}
	op, _ := engine.GetOperation(ctx, opOf(t, s, dropped.ID), 0, true)
	if op.Status != workflow.StatusFailed || !branchSeen(t, s.db.Pool, op.ID, workflow.BranchAbandoned) {
		t.Errorf("dropped: operation %s, want FAILED through the abandoned branch", op.Status)
	}
	// Another booker still meets the RUNNING charge's hold, overdue.
	_, err = bookSaga(ctx, s.booker, running.SlotID, s.users[1], "bob")
	var held *slots.SlotHeldError
	if !errors.As(err, &held) || held.Until.After(engine.Clock().Arg().Add(-time.Minute)) {
		t.Errorf("bob on the overdue hold: %v", err)
	}
	s.assertInvariants(t)
}

func opOf(t *testing.T, s *saga, bookingID int64) int64 {
	t.Helper()
	var id int64
	if err := s.db.Pool.QueryRow(context.Background(), `SELECT id FROM operations WHERE booking_id = $1 AND operation_type = 'BOOK_DEPOSIT'`, bookingID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func branchSeen(t *testing.T, db database.DBTX, opID int64, branch string) bool {
	t.Helper()
	events, err := readmodel.Timeline(context.Background(), db, opID)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.Branch != nil && *ev.Branch == branch {
			return true
		}
	}
	return false
}

// 64 users race for one deposit slot while the payments service is slow:
// one hold, one charge, one booking; the others are told it is held.
func TestManyUsersRaceForOneDepositSlot(t *testing.T) {
	t.Parallel()
	s := newSaga(t, patient, 0)
	ctx := context.Background()
	const racers = 64
	rows, err := s.db.Pool.Query(ctx, `
		INSERT INTO users (name, api_token_sha256)
		SELECT 'racer' || i, sha256(('racer' || i)::bytea) FROM generate_series(1, $1) AS i
		RETURNING id`, racers)
	if err != nil {
		t.Fatal(err)
	}
	users, _ := pgx.CollectRows(rows, pgx.RowTo[int64])
	s.setFault(t, func(f *fault.Fault) { f.Mode, f.SlowMS = fault.ModeSlow, 500 })
	warmPool(t, s.db.Pool)
	slotID := s.slotIDs[0]
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won, held int
	var other []error
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			bk, err := bookSaga(ctx, s.booker, slotID, users[i], fmt.Sprintf("racer-%d", i))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && bk.Status == slots.BookingConfirmed:
				won++
			case errors.Is(err, slots.ErrSlotHeld), errors.Is(err, slots.ErrSlotTaken):
				held++
			default:
				other = append(other, fmt.Errorf("%+v %w", bk, err))
			}
		}()
	}
	close(start)
	wg.Wait()
	if won != 1 || held != racers-1 || len(other) > 0 {
		t.Fatalf("won %d, held %d, other %v", won, held, other)
	}
	var charges, bookings int
	s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_payments.charges`).Scan(&charges)
	s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM bookings WHERE slot_id = $1`, slotID).Scan(&bookings)
	if charges != 1 || bookings != 1 {
		t.Fatalf("%d charges, %d bookings; want one of each", charges, bookings)
	}
	s.assertInvariants(t)
}

// The reverse saga: cancelling a deposit booking refunds the deposit under
// its own key, then frees the slot; a refused refund leaves it booked.
func TestCancellingADepositBookingRefundsThenReleases(t *testing.T) {
	t.Parallel()
	s := newSaga(t, patient, 0)
	ctx := context.Background()
	bk, err := bookSaga(ctx, s.booker, s.slotIDs[0], s.users[0], "b1")
	if err != nil || bk.Status != slots.BookingConfirmed {
		t.Fatalf("book: %+v %v", bk, err)
	}
	if _, err := release(ctx, s.booker, bk.ID, s.users[1], "bob"); !errors.Is(err, slots.ErrBookingNotFound) {
		t.Fatalf("bob cancelling alice's booking: %v", err)
	}
	s.setMode(t, fault.ModeReject)
	got, err := release(ctx, s.booker, bk.ID, s.users[0], "c1")
	if err != nil || got.Status != slots.BookingConfirmed || got.Operation.Status != workflow.StatusFailed {
		t.Fatalf("refund refused: %+v %v", got, err)
	}
	s.setMode(t, fault.ModeOK)
	got, err = release(ctx, s.booker, bk.ID, s.users[0], "c2") // started again: run 2, a new refund key
	if err != nil || got.Status != slots.BookingCancelled || got.Operation.Status != workflow.StatusSucceeded || got.Operation.Run != 2 {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	refund, _ := got.Operation.Step(slots.StepRefundDeposit)
	if refund.Key != workflow.StepKey(got.Operation.ID, slots.StepRefundDeposit, 2) {
		t.Errorf("refund key %s", refund.Key)
	}
	if _, err := release(ctx, s.booker, bk.ID, s.users[0], "c3"); !errors.Is(err, slots.ErrBookingNotConfirmed) {
		t.Errorf("cancelling twice: %v", err)
	}
	if slot, _ := s.state(t, bk.SlotID, bk.ID); slot != slots.StatusAvailable {
		t.Errorf("slot %s after the cancellation", slot)
	}
	// The same request key after a crash gets the operation as it is.
	again, err := bookSaga(ctx, s.booker, s.slotIDs[1], s.users[0], "b2")
	if err != nil {
		t.Fatal(err)
	}
	replay, err := bookSaga(ctx, s.booker, s.slotIDs[1], s.users[0], "b2")
	if err != nil || replay.ID != again.ID {
		t.Errorf("the same key again: %+v %v", replay, err)
	}
	s.assertInvariants(t)
}
