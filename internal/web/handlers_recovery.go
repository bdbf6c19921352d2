package web

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// recoverySnapshot is GET /api/v1/recovery and what the recovery page shows.
type recoverySnapshot struct {
	Instance string                    `json:"instance"`
	Settings recoverySettings          `json:"settings"`
	Counts   map[string]int            `json:"counts"`
	Live     []readmodel.LiveOperation `json:"live"`
	Recent   []readmodel.RecoveryEvent `json:"recent"`
	Beliefs  []recovery.Belief         `json:"systems"`
}

type recoverySettings struct {
	Strategy    string  `json:"strategy"`
	IntervalS   float64 `json:"interval_seconds"`
	LeaseS      float64 `json:"lease_seconds"`
	MaxPolls    int     `json:"max_polls"`
	PollTimeS   float64 `json:"max_poll_seconds"`
	MaxAttempts int     `json:"max_attempts"`
	ClockSkewS  float64 `json:"clock_skew_seconds"`
	ReaskS      float64 `json:"reask_interval_seconds"`
	BoundS      float64 `json:"bound_seconds"`
	CrashBoundS float64 `json:"bound_after_crash_seconds"`
	MaxBackoffS float64 `json:"max_backoff_seconds"`
}

// recoverySnapshot is for everyone signed in; a customer reads it with
// summaries in place of error texts (redact.go), and another customer's
// operation without its reason and request key (theirs, not the loop's).
func (app *App) recoverySnapshot(ctx context.Context, u users.User) (recoverySnapshot, error) {
	admin := u.IsAdmin()
	counts, err := readmodel.CountByStatus(ctx, app.pool)
	if err != nil {
		return recoverySnapshot{}, err
	}
	live, err := readmodel.ListLive(ctx, app.pool, app.engine, 50)
	if err != nil {
		return recoverySnapshot{}, err
	}
	recent, err := readmodel.RecentRecoveryEvents(ctx, app.pool, 30)
	if err != nil {
		return recoverySnapshot{}, err
	}
	beliefs, err := recovery.Beliefs(ctx, app.pool)
	if err != nil {
		return recoverySnapshot{}, err
	}
	if !admin {
		for i := range live {
			live[i].Operation = customerOperation(live[i].Operation)
			if live[i].UserID != u.ID {
				live[i].Operation = othersOperation(live[i].Operation)
			}
		}
		for i := range recent {
			recent[i].Detail = customerText(recent[i].Detail)
			if recent[i].UserID != u.ID { // another customer's (or anyone's, signed out): its branch, not its story
				recent[i].Detail, recent[i].PolicyID = "", 0
			}
		}
	}
	cfg := app.recovery.Settings()
	b := cfg.Budget()
	bounds := app.recovery.Bounds()
	return recoverySnapshot{
		Instance: app.cfg.InstanceID,
		Settings: recoverySettings{
			Strategy: string(cfg.Strategy), IntervalS: cfg.Interval.Seconds(), LeaseS: b.Lease.Seconds(),
			MaxPolls: b.MaxPolls, PollTimeS: b.MaxPollTime().Seconds(), MaxAttempts: b.MaxAttempts,
			ClockSkewS: b.ClockSkew.Seconds(), ReaskS: b.ReaskInterval.Seconds(), BoundS: bounds.Claimable.Seconds(),
			CrashBoundS: bounds.AfterCrash.Seconds(), MaxBackoffS: bounds.Backoff.Seconds(),
		},
		Counts: counts, Live: live, Recent: recent, Beliefs: beliefs,
	}, nil
}

// handleRecoveryAPI: GET /api/v1/recovery
func (app *App) handleRecoveryAPI(c echo.Context) error {
	u, _ := userFrom(c)
	s, err := app.recoverySnapshot(c.Request().Context(), u)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s)
}

// handleRecoveryPage: GET /recovery — for everyone, refreshing itself.
func (app *App) handleRecoveryPage(c echo.Context) error {
	v, err := app.recoveryView(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.RecoveryPage(app.page(c, "Recovery", "recovery"), v))
}

// handleRecoveryPanel: GET /recovery/panel — the htmx partial.
func (app *App) handleRecoveryPanel(c echo.Context) error {
	v, err := app.recoveryView(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.RecoveryPanel(v))
}

func (app *App) recoveryView(c echo.Context) (views.RecoveryView, error) {
	u, _ := userFrom(c)
	s, err := app.recoverySnapshot(c.Request().Context(), u)
	if err != nil {
		return views.RecoveryView{}, err
	}
	cfg := app.recovery.Settings()
	b := cfg.Budget()
	v := views.RecoveryView{
		Instance: s.Instance, Strategy: s.Settings.Strategy, Interval: cfg.Interval.String(), Lease: b.Lease.String(),
		MaxPolls: b.MaxPolls, PollTime: b.MaxPollTime().String(), MaxAttempts: b.MaxAttempts,
		ClockSkew: b.ClockSkew.String(), Reask: b.ReaskInterval.String(),
		Bound:      app.recovery.Bounds().Claimable.Round(100 * time.Millisecond).String(),
		CrashBound: app.recovery.Bounds().AfterCrash.Round(100 * time.Millisecond).String(),
		MaxBackoff: app.recovery.Bounds().Backoff.String(),
		EndLease:   app.cfg.DemoMode && u.IsAdmin(), CSRF: csrfToken(c),
	}
	for _, st := range workflow.Statuses {
		v.Counts = append(v.Counts, views.StatusCount{Status: st, N: s.Counts[st]})
	}
	for _, b := range s.Beliefs {
		v.Beliefs = append(v.Beliefs, views.Belief{System: b.System, Idempotent: b.Idempotent,
			By: b.UpdatedBy + " at " + b.UpdatedAt.UTC().Format("15:04:05 MST")})
	}
	for _, l := range s.Live {
		row := views.LiveOperation{
			ID: l.ID, Subject: l.Subject(), Status: l.Status, Owner: database.Deref(l.OwnerID), Lease: timeText(l.LeaseExpiresAt),
			Attempts: l.Attempts, LastError: database.Deref(l.LastError), State: "owned", StateKind: "DONE", Owned: !l.Stale,
		}
		if !u.IsAdmin() && l.UserID != u.ID {
			// Another customer's operation (anyone's, signed out): what recovery
			// does with it, not what it is about — as their policy pages answer
			// 404 to anyone else.
			row.Theirs, row.Subject, row.LastError = true, "another customer's", ""
		}
		switch {
		case l.Stale && l.Due:
			row.State, row.StateKind = "stale: claimable now", "IN_PROGRESS"
		case l.Stale:
			row.State, row.StateKind = "backing off until "+timeText(l.NextAttemptAt), "PENDING"
		}
		v.Live = append(v.Live, row)
	}
	for _, r := range s.Recent {
		v.Recent = append(v.Recent, views.RecoveryStep{
			At: r.At.UTC().Format("15:04:05.000"), OperationID: r.OperationID, Branch: database.Deref(r.Branch),
			Worker: r.Actor, To: r.ToStatus, Detail: r.Detail, Theirs: !u.IsAdmin() && r.UserID != u.ID,
		})
	}
	return v, nil
}
