package labs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
)

// The labs' fake external system: an HTTP service on a loopback port of its
// own, built on internal/fault exactly like the provider and payments fakes
// — the same modes, the same holds, the same idempotency switch, the same
// refusal of a call that arrives after its Request-Deadline — with its
// state in labs.fake_requests and labs.fake_effects. One lab's deliberate
// double effect therefore never reaches fake_provider.effects or
// fake_payments.ledger, whose invariants would rightly cry foul.
//
//	POST /v1/calls        {"subject_id": n, "what": "cancel"}  Idempotency-Key, Request-Deadline
//	GET  /v1/calls/{key}  the truth of a key
//
// Faults are scoped to a run's subjects (fault.Policy(subject)), so runs
// never change each other's faults.

// Names of the systems, as rows of the fault schema know them.
const (
	systemLabs       = "labs"        // status queries answer the truth
	systemLabsBelief = "labs-belief" // status queries fail: the wrong-belief lab
)

// callsPath is where the fake takes calls and answers status queries.
const callsPath = "/v1/calls"

var fakeRequests = fault.NewTable("labs", "fake_requests")

// system returns the fake system called name, starting it on first use.
func (l *Labs) system(name string) (*fakeSystem, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.systems[name]; ok {
		return s, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("labs: fake system %s: %w", name, err)
	}
	s := &fakeSystem{
		Service: fault.NewService(l.lab, name, []string{"policy"}, nil, fault.Options{HoldCap: 30 * time.Second, Logger: l.cfg.Logger}),
		url:     "http://" + ln.Addr().String(),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+callsPath, s.handleCall)
	mux.HandleFunc("GET "+callsPath+"/{key}", s.handleStatus)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go s.srv.Serve(ln)
	l.systems[name] = s
	return s, nil
}

// client returns a client of the system whose calls give up after timeout.
func (s *fakeSystem) client(timeout time.Duration) *external.Client {
	return external.NewClient("lab system", s.url, timeout)
}

// schedule queues faults for the next calls about subject: the fault
// machinery's script, used up one call per entry, in order.
func (s *fakeSystem) schedule(ctx context.Context, subject int64, faults ...fault.Fault) error {
	for _, f := range faults {
		f.PolicyID, f.Next = &subject, 1
		if _, err := s.SetFaults(ctx, f); err != nil {
			return fmt.Errorf("labs: schedule a fault: %w", err)
		}
	}
	return nil
}

// faultOf is a fault of mode on a system that is (or is not) idempotent.
func faultOf(mode fault.Mode, idempotent bool) fault.Fault {
	f := fault.Default()
	f.Mode, f.Idempotent = mode, idempotent
	return f
}

type callBody struct {
	SubjectID int64  `json:"subject_id"`
	What      string `json:"what"`
}

// handleCall is POST /v1/calls, through fault.Calls.Serve: a late call is
// refused before anything else, then the fault decides.
func (s *fakeSystem) handleCall(w http.ResponseWriter, r *http.Request) {
	var body callBody
	key, deadline, ok := fault.ReadCall(w, r, &body)
	if !ok {
		return
	}
	if body.SubjectID <= 0 || body.SubjectID > fault.MaxID || body.What == "" || len(body.What) > 32 {
		fault.WriteError(w, http.StatusBadRequest, "invalid_request", `body must be {"subject_id": <positive id>, "what": "…"}`)
		return
	}
	s.Calls.Serve(w, r, fault.Arrival{Key: key, Subject: fault.Policy(body.SubjectID), Deadline: deadline},
		func(ctx context.Context, f fault.Call) (fault.Record, error) {
			c := fakeCall{key: key, body: body, fault: f}
			var rec fault.Record
			err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
				if err := fault.Process(ctx, tx, f, fault.Policy(body.SubjectID), c); err != nil {
					return err
				}
				var err error
				rec, err = readFakeRecord(ctx, tx, key)
				return err
			})
			return rec, err
		},
		func(ctx context.Context) (fault.Record, error) { return readFakeRecord(ctx, s.Pool, key) })
}

// handleStatus is GET /v1/calls/{key}.
func (s *fakeSystem) handleStatus(w http.ResponseWriter, r *http.Request) {
	s.Calls.ServeStatus(w, r, func(ctx context.Context, key string) (any, bool, error) {
		rec, err := readFakeRecord(ctx, s.Pool, key)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, nil
		}
		return struct {
			Key    string         `json:"key"`
			Status external.Truth `json:"status"`
		}{rec.Key, rec.Truth}, err == nil, err
	})
}

// fakeCall is one call as the fake's state sees it (fault.Keyed).
type fakeCall struct {
	key   string
	body  callBody
	fault fault.Call
}

func (c fakeCall) Accepted() bool { return c.fault.Accepted() }

func (c fakeCall) InsertFirst(ctx context.Context, tx pgx.Tx) (bool, error) {
	outcome, reason := "ACCEPTED", (*string)(nil)
	if !c.Accepted() {
		refused := "the lab system refuses (fault mode reject)"
		outcome, reason = "REJECTED", &refused
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO labs.fake_requests (idempotency_key, subject_id, what, outcome, reject_reason, completes_at)
		VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 millisecond')
		-- the key is known (or a concurrent first call holds it): a repeat
		ON CONFLICT (idempotency_key) DO NOTHING`,
		c.key, c.body.SubjectID, c.body.What, outcome, reason, c.fault.CompletesIn().Milliseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

func (c fakeCall) CountRepeat(ctx context.Context, tx pgx.Tx) (fault.Subject, error) {
	var subject int64
	err := fakeRequests.CountRepeat(ctx, tx, c.key, "subject_id", &subject)
	return fault.Policy(subject), err
}

func (c fakeCall) AcceptAgain(ctx context.Context, tx pgx.Tx) error {
	return fakeRequests.AcceptAgain(ctx, tx, c.key, c.fault.CompletesIn())
}

// Notify: the lab's system sends no callbacks.
func (c fakeCall) Notify(context.Context, pgx.Tx) error { return nil }

// ApplyEffect writes the effect itself: one row per call carried out.
func (c fakeCall) ApplyEffect(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO labs.fake_effects (idempotency_key, subject_id, what, applied_at)
		VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')`,
		c.key, c.body.SubjectID, c.body.What, c.fault.CompletesIn().Milliseconds())
	return err
}

// readFakeRecord reads key's record; pgx.ErrNoRows means NOT_STARTED.
func readFakeRecord(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string) (fault.Record, error) {
	var rec fault.Record
	var reason *string
	var untilMS float64
	err := db.QueryRow(ctx, `
		SELECT idempotency_key,
		       fault.truth(outcome, completes_at, statement_timestamp()),
		       reject_reason,
		       extract(epoch FROM greatest(completes_at - statement_timestamp(), interval '0')) * 1000
		  FROM labs.fake_requests
		 WHERE idempotency_key = $1`, key).Scan(&rec.Key, &rec.Truth, &reason, &untilMS)
	if err != nil {
		return fault.Record{}, err
	}
	if reason != nil {
		rec.Reason = *reason
	}
	if rec.Truth == external.TruthRunning {
		rec.UntilComplete = time.Duration(untilMS * float64(time.Millisecond))
	}
	return rec, nil
}

// effectsOf counts the effects the fake carried out for subject (what = ""
// counts them all).
func (e *env) effectsOf(ctx context.Context, subject int64, what string) (int, error) {
	var n int
	err := e.lab.QueryRow(ctx, `
		SELECT count(*)
		  FROM fake_effects
		 WHERE subject_id = $1
		   AND ($2 = '' OR what = $2)`, subject, what).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("labs: effects of %d: %w", subject, err)
	}
	return n, nil
}

// arrivals reports how many calls with key the fake processed, and how many
// it refused for arriving after their deadline.
func (e *env) arrivals(ctx context.Context, system, key string) (processed, late int, err error) {
	err = e.lab.QueryRow(ctx, `
		SELECT coalesce((SELECT attempts FROM fake_requests WHERE idempotency_key = $2), 0),
		       (SELECT count(*) FROM fault.late_arrivals WHERE system = $1 AND idempotency_key = $2)`,
		system, key).Scan(&processed, &late)
	if err != nil {
		return 0, 0, fmt.Errorf("labs: arrivals of %s: %w", key, err)
	}
	return processed, late, nil
}
