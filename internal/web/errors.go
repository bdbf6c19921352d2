package web

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/reconciliation"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// The web layer's own refusals — bad input, no session, a form that
// expired — are these kinds. A handler says which with refuse, in its own
// words; errorTable decides the answer, as for every domain error.
var (
	errInvalidParameter     = errors.New("web: invalid parameter")
	errNoSuchResource       = errors.New("web: no such resource")
	errValidation           = errors.New("web: validation failed")
	errInvalidJSON          = errors.New("web: invalid JSON")
	errUnsupportedMediaType = errors.New("web: unsupported media type")
	errBodyUnreadable       = errors.New("web: request body unreadable")
	errBodyTooLarge         = errors.New("web: request body too large")
	errUnauthenticated      = errors.New("web: authentication required")
	errForbidden            = errors.New("web: forbidden")
	errCSRF                 = errors.New("web: form expired or forged")
	errRateLimited          = errors.New("web: rate limited")
	errFaultUnreadable      = errors.New("web: fault form unreadable")
	errInvalidCrashPoint    = errors.New("web: invalid crash point")
	errCrashPointNotHere    = errors.New("web: that crash point cannot be armed from a form")
	errConfirmationRequired = errors.New("web: confirmation required")
	errProviderRejected     = errors.New("web: the provider refused the cancellation")
	errRetryRefusedAgain    = errors.New("web: the retried step was refused again")
)

// refusal is one refusal of a kind above (or of a domain sentinel), in the
// words of the place that refused: a title ("" for the table's), the
// detail, and members a client can act on.
type refusal struct {
	kind    error
	title   string
	detail  string
	members []member
}

type member struct {
	name  string
	value any
}

// refuse is a refusal of kind, worded at the place that refuses.
func refuse(kind error, title, detail string) *refusal {
	return &refusal{kind: kind, title: title, detail: detail}
}

// With adds a member to the answer's JSON.
func (r *refusal) With(name string, value any) *refusal {
	r.members = append(r.members, member{name, value})
	return r
}

func (r *refusal) Error() string { return r.detail }
func (r *refusal) Unwrap() error { return r.kind }

// errorTable is the one place where an error becomes an HTTP answer: its
// status, its stable problem type (docs/api.md lists them) and a title. The
// detail is the error's own text, which domain packages write for people.
var errorTable = []struct {
	err    error
	status int
	typ    string
	title  string
}{
	{policies.ErrNotFound, http.StatusNotFound, "not-found", "Policy not found"},
	{workflow.ErrNotFound, http.StatusNotFound, "not-found", "Operation not found"},
	{policies.ErrDuplicateIntent, http.StatusConflict, "duplicate-intent", "The policy already has a cancellation"},
	{workflow.ErrStateChanged, http.StatusConflict, "state-changed", "Someone else already resolved it"},
	{reconciliation.ErrResolutionNotAllowed, http.StatusConflict, "resolution-not-allowed", "That decision does not fit this step"},
	{operations.ErrNotFailed, http.StatusConflict, "not-failed", "Only a FAILED operation can be resumed"},
	{operations.ErrResumeNotAllowed, http.StatusConflict, "resume-not-allowed", "This kind of operation is not resumed"},
	{workflow.ErrNotLive, http.StatusConflict, "not-live", "Only a live operation can be cancelled"},
	{workflow.ErrCancelRequested, http.StatusConflict, "cancel-already-requested", "A cancel of this operation was already requested"},
	// A retry from a step (operations/retry.go): one answer per unsafe case.
	{operations.ErrRetryNotStopped, http.StatusConflict, "retry-not-stopped", "Only a stopped operation is retried from a step"},
	{operations.ErrRetryNoSuchStep, http.StatusUnprocessableEntity, "validation-failed", "No such step"},
	{operations.ErrRetryStepUnknown, http.StatusConflict, "retry-step-unknown", "The step's outcome is unknown"},
	{operations.ErrRetryStepTookEffect, http.StatusConflict, "retry-step-took-effect", "The step took effect"},
	{operations.ErrRetryStepNotNext, http.StatusConflict, "retry-step-not-next", "The operation did not stop at that step"},
	{operations.ErrRetryAfterUndo, http.StatusConflict, "retry-after-undo", "What the earlier steps did was undone"},
	{recovery.ErrUnknownSystem, http.StatusNotFound, "not-found", "No such external system"},
	{slots.ErrNotFound, http.StatusNotFound, "not-found", "Slot not found"},
	{fault.ErrInvalidFault, http.StatusUnprocessableEntity, "invalid-fault", "Invalid fault"},
	{events.ErrEventNotFound, http.StatusNotFound, "not-found", "Event not found"},
	{events.ErrNotDead, http.StatusConflict, "not-dead", "The event is not dead-lettered"},
	{errProviderUnreachable, http.StatusBadGateway, "provider-unreachable", "Provider unreachable"},
	{errPaymentsUnreachable, http.StatusBadGateway, "payments-unreachable", "Payments unreachable"},
	{slots.ErrSlotTaken, http.StatusConflict, "slot-taken", "The slot is already booked"},
	{slots.ErrSlotHeld, http.StatusConflict, "slot-held", "The slot is held while another booking's deposit is charged"},
	{slots.ErrDepositDeclined, http.StatusPaymentRequired, "deposit-declined", "The deposit was declined"},
	{slots.ErrRefundRefused, http.StatusConflict, "refund-refused", "The deposit's refund was refused"},
	{slots.ErrCancelUnderWay, http.StatusConflict, "cancellation-under-way", "The booking's cancellation is under way"},
	{slots.ErrSlotInPast, http.StatusConflict, "slot-in-past", "The slot has already begun"},
	{slots.ErrBookingNotFound, http.StatusNotFound, "not-found", "Booking not found"},
	{slots.ErrBookingNotConfirmed, http.StatusConflict, "booking-not-confirmed", "The booking was already released"},
	{labs.ErrInvalidRace, http.StatusUnprocessableEntity, "validation-failed", "Invalid race"},
	{labs.ErrUnknownStrategy, http.StatusUnprocessableEntity, "validation-failed", "Unknown booking strategy"},
	{labs.ErrUnknownLab, http.StatusNotFound, "not-found", "Lab not found"},
	{labs.ErrRunNotFound, http.StatusNotFound, "not-found", "Lab run not found"},
	{labs.ErrUnavailable, http.StatusServiceUnavailable, "lab-unavailable", "The lab cannot run here"},
	{labs.ErrNoLiveLease, http.StatusConflict, "no-live-lease", "No running lease to end"},

	// The idempotency protocol's refusals (internal/idempotency).
	{idempotency.ErrNotSignedIn, http.StatusUnauthorized, "unauthenticated", "Not signed in"},
	{idempotency.ErrKeyMissing, http.StatusBadRequest, "idempotency-key-missing", "Idempotency key missing"},
	{idempotency.ErrKeyMalformed, http.StatusBadRequest, "idempotency-key-malformed", "Idempotency key malformed"},
	{idempotency.ErrFingerprintMismatch, http.StatusUnprocessableEntity, "idempotency-key-reused", "Idempotency key reused"},
	{idempotency.ErrInProgress, http.StatusConflict, "request-in-progress", "Request in progress"},
	{idempotency.ErrBodyUnreadable, http.StatusBadRequest, "request-body-unreadable", "Request body unreadable"},
	{idempotency.ErrBodyTooLarge, http.StatusRequestEntityTooLarge, "body-too-large", "Request too large"},

	// The web layer's own (refuse).
	{errInvalidParameter, http.StatusBadRequest, "invalid-parameter", "Invalid parameter"},
	{errNoSuchResource, http.StatusNotFound, "not-found", "Not found"},
	{errValidation, http.StatusUnprocessableEntity, "validation-failed", "Invalid input"},
	{errInvalidJSON, http.StatusBadRequest, "invalid-json", "Invalid JSON"},
	{errUnsupportedMediaType, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type"},
	{errBodyUnreadable, http.StatusBadRequest, "body-unreadable", "Request body unreadable"},
	{errBodyTooLarge, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large"},
	{errUnauthenticated, http.StatusUnauthorized, "unauthenticated", "Authentication required"},
	{errForbidden, http.StatusForbidden, "forbidden", "Forbidden"},
	{errCSRF, http.StatusForbidden, "csrf-token-invalid", "Form expired or forged"},
	{errRateLimited, http.StatusTooManyRequests, "rate-limited", "Too many requests"},
	{errFaultUnreadable, http.StatusBadRequest, "invalid-fault", "Invalid fault"},
	{errInvalidCrashPoint, http.StatusBadRequest, "invalid-crash-point", "Invalid crash point"},
	{errCrashPointNotHere, http.StatusUnprocessableEntity, "invalid-crash-point", "Invalid crash point"},
	{errConfirmationRequired, http.StatusUnprocessableEntity, "confirmation-required", "Confirmation required"},
	{errProviderRejected, http.StatusUnprocessableEntity, "provider-rejected", "The provider refused the cancellation"},
	{errRetryRefusedAgain, http.StatusConflict, "retry-refused-again", "The retried step was refused again"},
}

// toProblem turns any error a handler returned into a problem. Unknown
// errors become a bare 500: their text may hold internals, so it is logged,
// not sent.
func toProblem(err error) (*problem.Problem, bool) {
	var p *problem.Problem
	if errors.As(err, &p) {
		return p, true
	}
	if database.IsUnavailable(err) {
		// Down, restarting, recovering: nothing of the request was committed
		// (its transaction failed), so sending it again later is safe.
		return problem.New(http.StatusServiceUnavailable, "database-unavailable", "Database unavailable",
			"the database cannot be reached right now; nothing was changed — retry after the time in Retry-After"), true
	}
	for _, row := range errorTable {
		if !errors.Is(err, row.err) {
			continue
		}
		var r *refusal
		if errors.As(err, &r) {
			p := problem.New(row.status, row.typ, cmp.Or(r.title, row.title), r.detail)
			for _, m := range r.members {
				p.With(m.name, m.value)
			}
			return p, true
		}
		return enrich(problem.New(row.status, row.typ, row.title, publicDetail(err)), err), true
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return httpErrorProblem(he), true
	}
	return problem.New(http.StatusInternalServerError, "internal", "Internal error",
		"something went wrong on our side; the request id in X-Request-Id helps us find it"), false
}

// packagePrefix is the "pkg: " Go errors start with (and wrapping adds).
var packagePrefix = regexp.MustCompile(`(^|: )[a-z][a-z0-9]*: `)

// publicDetail is err's text for a client: the words the domain package
// wrote, without the "policies: " prefixes that say where in the code it
// came from.
func publicDetail(err error) string {
	d := err.Error()
	for {
		next := packagePrefix.ReplaceAllString(d, "$1")
		if next == d {
			return d
		}
		d = next
	}
}

// enrich adds the members some errors carry, so a client can act on the
// answer without parsing the detail.
func enrich(p *problem.Problem, err error) *problem.Problem {
	var held *slots.SlotHeldError
	if errors.As(err, &held) {
		p.With("slot_id", held.SlotID).With("held_until", held.Until.UTC().Format(time.RFC3339Nano))
	}
	var under *slots.CancelUnderWayError
	if errors.As(err, &under) {
		p.With("operation_id", under.OperationID).With("operation_status", under.Status).
			With("operation_url", fmt.Sprintf("/api/v1/operations/%d", under.OperationID))
	}
	var notFailed *operations.NotFailedError
	if errors.As(err, &notFailed) {
		p.With("operation_status", notFailed.Status)
	}
	var retry *operations.RetryRefusal
	if errors.As(err, &retry) {
		p.With("step", retry.Step).With("operation_status", retry.Status)
		if retry.State != "" {
			p.With("step_state", retry.State)
		}
		if errors.Is(err, operations.ErrRetryNoSuchStep) {
			p.With("field", "step")
		}
	}
	var dup *policies.DuplicateIntentError
	if errors.As(err, &dup) {
		p.With("operation_id", dup.OperationID).With("operation_status", dup.Status).
			With("operation_url", fmt.Sprintf("/api/v1/operations/%d", dup.OperationID)).
			With("rule", reuseRule(dup.Status))
	}
	return p
}

// httpErrorProblem covers the errors Echo itself raises (no route, body
// too large, …).
func httpErrorProblem(he *echo.HTTPError) *problem.Problem {
	msg, _ := he.Message.(string)
	switch he.Code {
	case http.StatusNotFound:
		return problem.New(he.Code, "not-found", "Not found", "no such resource")
	case http.StatusMethodNotAllowed:
		return problem.New(he.Code, "method-not-allowed", "Method not allowed", "this resource does not accept that method")
	case http.StatusRequestEntityTooLarge:
		return problem.New(he.Code, "body-too-large", "Request body too large", "the request body is larger than the server accepts")
	case http.StatusUnsupportedMediaType:
		return problem.New(he.Code, "unsupported-media-type", "Unsupported media type", "send application/json")
	default:
		if msg == "" {
			msg = http.StatusText(he.Code)
		}
		return problem.New(he.Code, "http-error", http.StatusText(he.Code), msg)
	}
}

// handleError is Echo's HTTPErrorHandler: API requests get problem+json,
// browsers a friendly page with the same status.
func (app *App) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if clientLeft(c, err) {
		// The client left (a browser navigating away mid-poll): nobody is
		// there to answer and nothing failed on our side. 499 is the
		// request log's word for it, as nginx's.
		logFrom(c.Request().Context()).Info("the client left before the answer", "path", c.Request().URL.Path)
		c.Response().WriteHeader(statusClientLeft)
		return
	}
	p, known := toProblem(err)
	switch {
	case !known:
		logFrom(c.Request().Context()).Error("unhandled error", "err", err, "path", c.Request().URL.Path)
	case p.Type == "database-unavailable":
		logFrom(c.Request().Context()).Warn("database unavailable", "err", err, "path", c.Request().URL.Path)
		c.Response().Header().Set("Retry-After", "2")
	}
	p.Instance = c.Request().URL.Path
	if isAPI(c) {
		problem.Write(c.Response(), p)
		return
	}
	detail := p.Detail
	switch {
	case p.Type == "database-unavailable":
		detail = "The database is briefly unavailable, so nothing was changed. Try again in a moment."
	case !known:
		// An unknown error's text may hold internals; a known problem's
		// detail is written for people (lab-unavailable names what is
		// missing, an unreachable fake says where the cause is logged).
		detail = "Something went wrong on our side. Please try again in a moment."
	}
	c.Response().Status = p.Status
	app.sessionForErrorPage(c)
	if p.Type == "rate-limited" {
		v := rateLimitedView(c, p)
		if c.Request().Header.Get("HX-Request") == "true" {
			render(c, p.Status, views.RateLimited(v)) // into the panel the form targets
			return
		}
		render(c, p.Status, views.RateLimitedPage(app.page(c, "Too many for now", ""), v))
		return
	}
	render(c, p.Status, views.ErrorPage(app.page(c, http.StatusText(p.Status), ""), p.Status, detail))
}

// rateLimitedView says when to try again (Retry-After, set with the
// refusal) and leads back where the reader came from: the page that sent
// the form when it is this site's, else the labs or the start.
func rateLimitedView(c echo.Context, p *problem.Problem) views.RateLimitedView {
	secs, _ := strconv.Atoi(c.Response().Header().Get("Retry-After"))
	limit, _ := p.Extra["limit"].(string)
	v := views.RateLimitedView{Seconds: secs, At: time.Now().Add(time.Duration(secs) * time.Second).UTC().Format("15:04:05 MST"),
		Limit: limit, Detail: p.Detail, Back: "/", BackName: "the start"}
	if limit == "labs" {
		v.Back, v.BackName = "/labs", "the labs"
	}
	if ref, err := url.Parse(c.Request().Referer()); err == nil && ref.Host == c.Request().Host && strings.HasPrefix(ref.Path, "/") {
		v.Back, v.BackName = ref.Path, "the page you came from"
	}
	return v
}

// statusClientLeft is logged for a request whose client closed the
// connection before its answer.
const statusClientLeft = 499

// clientLeft reports whether err is the request's own context ending
// because its client closed the connection (a browser navigating away
// mid-poll): not a failure of the app or of anything it called.
func clientLeft(c echo.Context, err error) bool {
	return errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil
}

func isAPI(c echo.Context) bool {
	return strings.HasPrefix(c.Request().URL.Path, "/api/") || strings.HasPrefix(c.Request().URL.Path, "/webhooks/")
}

// reuseRule names which half of the reuse policy refused a second intent
// (docs/workflows.md, "The reuse policy, named"): the existing operation is
// not finished (conflict-fail: a running one is never started twice), or
// it SUCCEEDED (reuse-failed-only: a finished one runs again only if it
// FAILED).
func reuseRule(existingStatus string) string {
	if existingStatus == workflow.StatusSucceeded {
		return "reuse-failed-only"
	}
	return "conflict-fail"
}
