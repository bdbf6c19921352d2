package web

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// handleListSlots: GET /api/v1/slots?status=&deposit=&limit=&cursor=
func (app *App) handleListSlots(c echo.Context) error {
	lp, err := parseListParams(c)
	if err != nil {
		return err
	}
	status := c.QueryParam("status")
	if status != "" && status != slots.StatusAvailable && status != slots.StatusHeld && status != slots.StatusBooked {
		return invalidParam("status", "status must be AVAILABLE, HELD or BOOKED")
	}
	var deposit *bool
	switch c.QueryParam("deposit") {
	case "":
	case "true", "false":
		d := c.QueryParam("deposit") == "true"
		deposit = &d
	default:
		return invalidParam("deposit", "deposit must be true or false")
	}
	rows, err := app.slots.List(c.Request().Context(), slots.ListFilter{Status: status, Deposit: deposit, AfterID: lp.AfterID, Limit: lp.Limit + 1})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newListPage(rows, lp.Limit, func(s slots.Slot) int64 { return s.ID }))
}

// handleSlotsPage: GET /slots — the grid, with a Book button on every free
// slot and a Release button on each of yours; ?notice= says what the last
// form did.
func (app *App) handleSlotsPage(c echo.Context) error {
	u, _ := userFrom(c)
	ctx := c.Request().Context()
	var all []slots.Slot
	for after := int64(0); ; {
		batch, err := app.slots.List(ctx, slots.ListFilter{AfterID: after, Limit: maxLimit})
		if err != nil {
			return err
		}
		all = append(all, batch...)
		if len(batch) < maxLimit {
			break
		}
		after = batch[len(batch)-1].ID
	}
	mine, err := app.slots.ListBookings(ctx, slots.BookingFilter{UserID: u.ID, Status: slots.BookingConfirmed, Limit: maxLimit})
	if err != nil {
		return err
	}
	holding, err := app.slots.ListBookings(ctx, slots.BookingFilter{UserID: u.ID, Status: slots.BookingPending, Limit: maxLimit})
	if err != nil {
		return err
	}
	mineBySlot := make(map[int64]int64, len(mine)+len(holding)) // slot id → booking id
	for _, b := range append(mine, holding...) {
		mineBySlot[b.SlotID] = b.ID
	}
	p := app.page(c, "Slots", "slots")
	vm := views.SlotsView{Grids: slotGrids(all, mineBySlot, u.IsAdmin(), time.Now()), Mine: len(mineBySlot), Zone: "UTC"}
	if notice := c.QueryParam("notice"); notice != "" {
		slotID, _ := strconv.ParseInt(c.QueryParam("slot"), 10, 64)
		var subject *slots.Slot
		if i := slices.IndexFunc(all, func(s slots.Slot) bool { return s.ID == slotID }); i >= 0 {
			subject = &all[i]
		}
		_, yours := mineBySlot[slotID]
		if notice == noticeSlotTaken && yours {
			notice = noticeAlreadyYours // two tabs, two keys, one booking: yours
		}
		p.Flash = slotNotice(notice, subject)
		vm.Highlight = slotID
	}
	return render(c, http.StatusOK, views.SlotsPage(p, vm))
}

// slotGrids arranges slots as one grid per resource: hours down, days
// across. Each free slot and each of the user's bookings gets a form with an
// idempotency key minted now, for this rendering.
func slotGrids(list []slots.Slot, mineBySlot map[int64]int64, admin bool, now time.Time) []views.SlotGrid {
	type cellKey struct{ day, hour string }
	var order []string
	byRes := map[string]map[cellKey]*views.SlotCell{}
	daySet, hourSet := map[string]bool{}, map[string]bool{}
	var days, hours []string
	for _, s := range list {
		if byRes[s.Resource] == nil {
			byRes[s.Resource] = map[cellKey]*views.SlotCell{}
			order = append(order, s.Resource)
		}
		d, h := s.StartsAt.UTC().Format("Mon 2 Jan"), s.StartsAt.UTC().Format("15:04")
		if !daySet[d] {
			daySet[d] = true
			days = append(days, d)
		}
		if !hourSet[h] {
			hourSet[h] = true
			hours = append(hours, h)
		}
		cell := &views.SlotCell{ID: s.ID, Status: s.Status, Name: slotName(s), Past: !s.StartsAt.After(now)}
		if s.DepositCents != nil {
			cell.Deposit = fmt.Sprintf("%d.%02d", *s.DepositCents/100, *s.DepositCents%100)
		}
		switch bookingID, yours := mineBySlot[s.ID]; {
		case cell.Past:
			// begun: nothing to book or release (the server refuses it too, 409 slot-in-past)
		case s.Status == slots.StatusHeld:
			cell.HeldUntil = s.HeldUntil.UTC().Format("15:04")
			cell.Mine, cell.BookingID = yours, bookingID // no form: a hold is the saga's until it ends
		case s.Status == slots.StatusAvailable:
			cell.FormKey = newFormKey()
		case yours:
			cell.Mine, cell.BookingID, cell.FormKey = true, bookingID, newFormKey()
		case admin && s.BookingID != nil:
			cell.BookingID, cell.FormKey = *s.BookingID, newFormKey() // an admin may release anyone's
		}
		byRes[s.Resource][cellKey{d, h}] = cell
	}
	slices.Sort(hours)
	grids := make([]views.SlotGrid, 0, len(order))
	for _, r := range order {
		g := views.SlotGrid{Resource: r, Days: days, Hours: hours, Cells: make([][]*views.SlotCell, len(hours))}
		for i, h := range hours {
			g.Cells[i] = make([]*views.SlotCell, len(days))
			for j, d := range days {
				g.Cells[i][j] = byRes[r][cellKey{d, h}]
			}
		}
		grids = append(grids, g)
	}
	return grids
}

// handleBookSlot: POST /api/v1/slots/:id/book (Idempotency-Key).
// 201 booking + Location · 409 slot-taken · 409 slot-held (a deposit
// booking holds it; held_until says until when) · 404 unknown slot. A slot
// that needs a deposit answers too: 202 booking PENDING (the deposit's
// charge unknown: recovery finds out) · 402 deposit-declined (the hold was
// released). The body is optional and has no fields.
func (app *App) handleBookSlot(c echo.Context) error {
	var in struct{}
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err // refused before the workflow: nothing claimed, nothing stored
	}
	return app.bookSlot(c, func(c echo.Context, b slots.Booking, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		return bookingAnswer(c, b, http.StatusCreated)
	})
}

// bookingAnswer is the API's answer with a booking: done (status), still
// waiting for the payments service (202), or its deposit saga failed. Its
// operation is as the caller may read it (operationFor, redact.go).
func bookingAnswer(c echo.Context, b slots.Booking, done int) (idempotency.Response, error) {
	status := done
	if b.Operation != nil {
		op := operationFor(c, *b.Operation)
		b.Operation = &op
		switch b.Operation.Status {
		case workflow.StatusFailed:
			refusal := slots.ErrDepositDeclined
			if b.Operation.Type == slots.OperationCancelDeposit {
				refusal = slots.ErrRefundRefused
			}
			p, _ := toProblem(refusal)
			p.Instance = c.Request().URL.Path
			p.With("booking_id", b.ID).With("booking_status", b.Status).
				With("operation_id", b.Operation.ID).With("operation_url", operationURL(b.Operation.ID))
			if b.Operation.LastError != nil {
				p.With("reason", *b.Operation.LastError)
			}
			return problemResponse(p)
		case workflow.StatusSucceeded:
		default:
			status = http.StatusAccepted // the outcome at the payments service is not known yet
		}
	}
	resp, err := idempotency.JSONResponse(status, b)
	resp.Header.Set(echo.HeaderLocation, bookingURL(b.ID))
	if status == http.StatusAccepted {
		// the operation to watch for the outcome (wait.go)
		resp.Header.Set("Link", monitorLink(b.Operation.ID))
	}
	return resp, err
}

// handleBookSlotForm: POST /slots/:id/book (form, hidden idempotency_key).
// The answer is always a redirect back to the grid with a notice
// (POST/redirect/GET), stored with the key: a double-click or a reload of
// the POST lands on the same notice. Losing the slot to someone else is a
// notice too, never an error page.
func (app *App) handleBookSlotForm(c echo.Context) error {
	return app.bookSlot(c, func(c echo.Context, b slots.Booking, refusal error) (idempotency.Response, error) {
		id, _ := pathID(c, "id")
		switch {
		case errors.Is(refusal, slots.ErrSlotTaken):
			return redirectAnswer(slotsNoticeURL(noticeSlotTaken, id))
		case errors.Is(refusal, slots.ErrSlotHeld):
			return redirectAnswer(slotsNoticeURL(noticeSlotHeld, id))
		case errors.Is(refusal, slots.ErrSlotInPast):
			return redirectAnswer(slotsNoticeURL(noticeSlotInPast, id))
		case refusal != nil:
			return app.refusalPage(c, refusal)
		case b.Operation != nil:
			return redirectAnswer(bookingPageURL(b.ID)) // the saga's steps, on the booking's page
		}
		return redirectAnswer(slotsNoticeURL(noticeBooked, id))
	})
}

// bookSlot is the one call both book handlers make: the booking, the key's
// claim and the stored answer in one commit (slots.Booker).
func (app *App) bookSlot(c echo.Context, answer answerer[slots.Booking]) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	req := slots.BookSlot{SlotID: id, UserID: u.ID,
		RequestKey: idempotency.AttemptFrom(c.Request().Context()).KeyOrEmpty(), Actor: app.actor(c)}
	return respond(c, answer, func(hooks workflow.Hooks[slots.Booking]) error {
		_, err := app.booker.Book(c.Request().Context(), req, hooks)
		return err
	})
}

// handleCancelBooking: POST /api/v1/bookings/:id/cancel (Idempotency-Key).
// 200 booking (CANCELLED) · 409 booking-not-confirmed · 404 unknown or
// someone else's (an admin may release any). A booking paid with a deposit
// is the reverse saga: 200 CANCELLED (refunded, released) · 202 still
// CONFIRMED, the refund's outcome unknown · 409 refund-refused ·
// 409 cancellation-under-way.
func (app *App) handleCancelBooking(c echo.Context) error {
	var in struct{}
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err
	}
	return app.releaseBooking(c, func(c echo.Context, b slots.Booking, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		return bookingAnswer(c, b, http.StatusOK)
	})
}

// handleCancelBookingForm: POST /bookings/:id/cancel (form, hidden
// idempotency_key). Like booking: a redirect to the grid with a notice.
func (app *App) handleCancelBookingForm(c echo.Context) error {
	return app.releaseBooking(c, func(c echo.Context, b slots.Booking, refusal error) (idempotency.Response, error) {
		switch {
		case errors.Is(refusal, slots.ErrBookingNotConfirmed):
			// Released already, from another tab or an earlier form.
			return redirectAnswer(slotsNoticeURL(noticeAlreadyReleased, 0))
		case refusal != nil:
			return app.refusalPage(c, refusal)
		case b.Operation != nil:
			return redirectAnswer(bookingPageURL(b.ID))
		}
		return redirectAnswer(slotsNoticeURL(noticeReleased, b.SlotID))
	})
}

// releaseBooking is the one call both release handlers make.
func (app *App) releaseBooking(c echo.Context, answer answerer[slots.Booking]) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	req := slots.ReleaseBooking{BookingID: id, UserID: u.ID, AsAdmin: u.IsAdmin(),
		RequestKey: idempotency.AttemptFrom(c.Request().Context()).KeyOrEmpty(), Actor: app.actor(c)}
	return respond(c, answer, func(hooks workflow.Hooks[slots.Booking]) error {
		_, err := app.booker.Release(c.Request().Context(), req, hooks)
		return err
	})
}

// handleListBookings: GET /api/v1/bookings?status=&limit=&cursor=
func (app *App) handleListBookings(c echo.Context) error {
	u, _ := userFrom(c)
	lp, err := parseListParams(c)
	if err != nil {
		return err
	}
	status := c.QueryParam("status")
	if status != "" && status != slots.BookingConfirmed && status != slots.BookingCancelled {
		return invalidParam("status", "status must be CONFIRMED or CANCELLED")
	}
	rows, err := app.slots.ListBookings(c.Request().Context(), slots.BookingFilter{
		UserID: u.ID, Status: status, AfterID: lp.AfterID, Limit: lp.Limit + 1,
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newListPage(rows, lp.Limit, func(b slots.Booking) int64 { return b.ID }))
}

// handleGetBooking: GET /api/v1/bookings/:id — 404 for someone else's.
func (app *App) handleGetBooking(c echo.Context) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	b, err := app.slots.GetBooking(c.Request().Context(), id, u.ID, u.IsAdmin())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, b)
}

func bookingURL(id int64) string { return fmt.Sprintf("/api/v1/bookings/%d", id) }

func bookingPageURL(id int64) string { return fmt.Sprintf("/bookings/%d", id) }

// Notices the grid shows after a form, named in the redirect's query.
const (
	noticeBooked          = "booked"
	noticeSlotTaken       = "slot-taken"
	noticeSlotHeld        = "slot-held"
	noticeSlotInPast      = "slot-in-past"
	noticeReleased        = "released"
	noticeAlreadyReleased = "already-released"
	noticeAlreadyYours    = "already-yours" // chosen at render: slot-taken by yourself
)

func slotsNoticeURL(notice string, slotID int64) string {
	if slotID == 0 {
		return "/slots?notice=" + notice
	}
	return fmt.Sprintf("/slots?notice=%s&slot=%d", notice, slotID)
}

// slotNotice says in words what the last form did to slot s.
func slotNotice(notice string, s *slots.Slot) string {
	name := "the slot"
	if s != nil {
		name = slotName(*s)
	}
	switch notice {
	case noticeBooked:
		return "Booked " + name + ". It is marked yours below."
	case noticeSlotTaken:
		return "Someone else booked " + name + " just before you. Nothing was booked for you — pick another slot."
	case noticeSlotHeld:
		until := ""
		if s != nil && s.HeldUntil != nil {
			until = " until " + s.HeldUntil.UTC().Format("15:04:05 MST")
		}
		return name + " is held for someone else's booking while their deposit is charged" + until +
			". Nothing was booked for you — it comes free only if their deposit is refused."
	case noticeSlotInPast:
		return name + " has already begun, so it can no longer be booked. Nothing was booked — pick a later slot."
	case noticeAlreadyYours:
		return name + " is already yours (booked from another tab or an earlier click). Nothing else was booked."
	case noticeReleased:
		return "Released " + name + ": it is free again."
	case noticeAlreadyReleased:
		return "That booking was already released (from another tab, perhaps). Nothing changed."
	default:
		return ""
	}
}

// slotName is how people read a slot: "Consulting room 1, Tue 3 Dec 10:00 UTC".
// Slots are kept as timestamptz and shown in UTC, always with the zone.
func slotName(s slots.Slot) string {
	return s.Resource + ", " + s.StartsAt.UTC().Format("Mon 2 Jan 15:04 MST")
}

// handleBookingPage: GET /bookings/:id — one of your bookings (any, for an
// admin). A deposit booking shows its saga as the operation page does —
// steps, each system's truth, calls, timeline — refreshing until it ends.
func (app *App) handleBookingPage(c echo.Context) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	b, err := app.slots.GetBooking(ctx, id, u.ID, u.IsAdmin())
	if err != nil {
		return err
	}
	sl, err := app.slots.Get(ctx, b.SlotID)
	if err != nil {
		return err
	}
	vm := views.BookingView{ID: b.ID, SlotName: slotName(sl), Status: b.Status}
	if b.DepositCents != nil {
		vm.Deposit = fmt.Sprintf("%d.%02d", *b.DepositCents/100, *b.DepositCents%100)
	}
	if sl.Status == slots.StatusHeld && sl.BookingID != nil && *sl.BookingID == b.ID && sl.HeldUntil != nil {
		vm.HeldUntil = sl.HeldUntil.UTC().Format("Mon 2 Jan 15:04:05 MST")
	}
	ops, err := app.engine.BookingOperations(ctx, b.ID)
	if err != nil {
		return err
	}
	for i, op := range ops {
		if i < len(ops)-1 {
			vm.Earlier = append(vm.Earlier, views.OperationLink{ID: op.ID, Kind: sagaKind(op.Type), Status: op.Status})
			continue
		}
		v, err := app.viewOperation(ctx, op, u.IsAdmin())
		if err != nil {
			return err
		}
		detail, err := app.operationDetail(ctx, v, u.IsAdmin())
		if err != nil {
			return err
		}
		vm.Saga = &detail
		if op.Type == slots.OperationBookDeposit && op.Status == workflow.StatusFailed {
			vm.NotCharged = depositNotCharged(op)
		}
	}
	cancelling := len(ops) > 0 && ops[len(ops)-1].Type == slots.OperationCancelDeposit && !ops[len(ops)-1].Terminal()
	if b.Status == slots.BookingConfirmed && !cancelling {
		vm.CancelKey = newFormKey()
	}
	if vm.Saga != nil && vm.Saga.Status == "FAILED" && b.Status == slots.BookingConfirmed {
		vm.Notice = "The deposit's refund was refused, so the booking stands: nothing was released."
	}
	return render(c, http.StatusOK, views.BookingPage(app.page(c, "Booking", "slots"), vm))
}

// sagaKind names a booking's operation as the Operations list does
// (kindWords): one name on every page (issue 29's second read: the list
// said "Deposit cancellation", the operation's own page "Deposit refund").
func sagaKind(operationType string) string {
	if operationType == slots.OperationCancelDeposit {
		return kindWords(slots.OperationCancelDeposit)
	}
	return kindWords(slots.OperationBookDeposit)
}
