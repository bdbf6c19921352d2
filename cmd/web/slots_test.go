package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/testdb"
)

type bookingJSON struct {
	ID     int64  `json:"id"`
	SlotID int64  `json:"slot_id"`
	UserID int64  `json:"user_id"`
	Status string `json:"status"`
}

func newKey() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// bookers inserts n customers with known tokens (HashToken is plain
// SHA-256, so SQL's sha256() stores the same hash) and returns the tokens.
func bookers(t testing.TB, db *testdb.DB, n int) []string {
	t.Helper()
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("token-booker-%02d-%s", i+1, newKey())
		_, err := db.Pool.Exec(context.Background(), `INSERT INTO users (name, api_token_sha256) VALUES ($1, sha256($2::bytea))`,
			fmt.Sprintf("booker-%02d", i+1), tokens[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	return tokens
}

// freeSlot returns the id of the nth AVAILABLE slot of the demo week.
func freeSlot(t testing.TB, db *testdb.DB, nth int) int64 {
	t.Helper()
	var id int64
	err := db.Pool.QueryRow(context.Background(), `
		SELECT id FROM slots WHERE status = 'AVAILABLE' AND resource <> $1 ORDER BY id OFFSET $2 LIMIT 1`,
		labs.RaceResource, nth).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// assertInvariant3 checks invariant 3 of docs/invariants.md over every slot.
func assertInvariant3(t testing.TB, db *testdb.DB) {
	t.Helper()
	v, err := slots.NewStore(db.Pool).CheckInvariant(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 0 {
		t.Fatalf("invariant 3 broken: %v", v)
	}
}

func (s *testServer) book(token string, slotID int64, key, body string) response {
	s.t.Helper()
	return s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/slots/%d/book", slotID), Token: token, Body: body,
		Header: map[string]string{"Idempotency-Key": key}})
}

func (s *testServer) release(token string, bookingID int64, key string) response {
	s.t.Helper()
	return s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/bookings/%d/cancel", bookingID), Token: token,
		Header: map[string]string{"Idempotency-Key": key}})
}

func assertReplay(t *testing.T, first, again response) {
	t.Helper()
	if again.Header.Get("Idempotent-Replayed") != "true" || again.Status != first.Status || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("not a replay: first %d %s\nagain %d %s (Idempotent-Replayed %q)",
			first.Status, first.Body, again.Status, again.Body, again.Header.Get("Idempotent-Replayed"))
	}
}

// 64 users book one slot at once, each with their own key: exactly one
// 201, every other answer a clean 409 slot-taken — stored, so a retry
// replays it.
func TestSixtyFourUsersBookOneSlot(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"DB_MAX_CONNS": "16"})
	const racers = 64
	tokens := bookers(t, s.DB, racers)
	slotID := freeSlot(t, s.DB, 0)

	keys := make([]string, racers)
	answers := make([]response, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range racers {
		keys[i] = newKey()
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = s.book(tokens[i], slotID, keys[i], "")
		}()
	}
	close(start) // every request at once
	wg.Wait()

	winner, losers := -1, 0
	for i, r := range answers {
		switch {
		case r.Status == http.StatusCreated:
			if winner >= 0 {
				t.Fatalf("two winners: %s and %s", answers[winner].Body, r.Body)
			}
			winner = i
		case r.Status == http.StatusConflict && r.problemType() == "slot-taken":
			losers++
		default:
			t.Errorf("racer %d: %d %s", i, r.Status, r.Body)
		}
	}
	if winner < 0 || losers != racers-1 {
		t.Fatalf("winner %d, %d slot-taken of %d", winner, losers, racers)
	}
	var b bookingJSON
	answers[winner].JSON(t, &b)
	if loc := answers[winner].Header.Get("Location"); loc != fmt.Sprintf("/api/v1/bookings/%d", b.ID) || b.Status != "CONFIRMED" {
		t.Errorf("201: Location %q, %+v", loc, b)
	}

	// Retries replay: the win, and a loss (the 409 was stored too).
	assertReplay(t, answers[winner], s.book(tokens[winner], slotID, keys[winner], ""))
	loser := (winner + 1) % racers
	assertReplay(t, answers[loser], s.book(tokens[loser], slotID, keys[loser], ""))

	var confirmed int
	var status string
	s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(b.id), s.status
		  FROM slots s LEFT JOIN bookings b ON b.slot_id = s.id AND b.status = 'CONFIRMED'
		 WHERE s.id = $1 GROUP BY s.id`, slotID).Scan(&confirmed, &status)
	if confirmed != 1 || status != "BOOKED" {
		t.Fatalf("slot %d: %s with %d confirmed bookings", slotID, status, confirmed)
	}
	assertInvariant3(t, s.DB)
}

// The same user double-submits with two different keys (two tabs): one
// booking; the second answer is 409 slot-taken.
func TestSameUserTwoKeysOneBooking(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	slotID := freeSlot(t, s.DB, 0)
	answers := make([]response, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() { defer wg.Done(); <-start; answers[i] = s.book("demo-alice", slotID, newKey(), "") }()
	}
	close(start)
	wg.Wait()
	created := 0
	for _, r := range answers {
		switch {
		case r.Status == http.StatusCreated:
			created++
		case r.Status == http.StatusConflict && r.problemType() == "slot-taken":
		default:
			t.Fatalf("%d %s", r.Status, r.Body)
		}
	}
	var n int
	s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM bookings WHERE slot_id = $1`, slotID).Scan(&n)
	if created != 1 || n != 1 {
		t.Fatalf("%d created, %d bookings", created, n)
	}
	assertInvariant3(t, s.DB)
}

func TestBookReleaseBookAgainOverHTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	slotID := freeSlot(t, s.DB, 0)

	r := s.book("demo-alice", slotID, newKey(), "")
	if r.Status != http.StatusCreated {
		t.Fatalf("alice books: %d %s", r.Status, r.Body)
	}
	var alices bookingJSON
	r.JSON(t, &alices)
	if got := s.do(request{Method: "GET", Path: r.Header.Get("Location"), Token: "demo-alice"}); got.Status != 200 {
		t.Fatalf("GET Location: %d %s", got.Status, got.Body)
	}
	// Someone else's booking is not found — to read or to release.
	if got := s.do(request{Method: "GET", Path: r.Header.Get("Location"), Token: "demo-bob"}); got.Status != 404 {
		t.Errorf("bob GETs alice's booking: %d", got.Status)
	}
	if got := s.release("demo-bob", alices.ID, newKey()); got.Status != 404 || got.problemType() != "not-found" {
		t.Fatalf("bob releases alice's booking: %d %s", got.Status, got.Body)
	}
	if got := s.book("demo-bob", slotID, newKey(), ""); got.Status != 409 || got.problemType() != "slot-taken" {
		t.Fatalf("bob books a booked slot: %d %s", got.Status, got.Body)
	}

	releaseKey := newKey()
	released := s.release("demo-alice", alices.ID, releaseKey)
	var rb bookingJSON
	released.JSON(t, &rb)
	if released.Status != 200 || rb.Status != "CANCELLED" {
		t.Fatalf("alice releases: %d %s", released.Status, released.Body)
	}
	assertInvariant3(t, s.DB)
	// Releasing twice: the same key replays the 200; a new key is a new
	// request, refused with 409 booking-not-confirmed.
	assertReplay(t, released, s.release("demo-alice", alices.ID, releaseKey))
	if got := s.release("demo-alice", alices.ID, newKey()); got.Status != 409 || got.problemType() != "booking-not-confirmed" {
		t.Fatalf("release twice, new key: %d %s", got.Status, got.Body)
	}

	r = s.book("demo-bob", slotID, newKey(), "")
	var bobs bookingJSON
	r.JSON(t, &bobs)
	if r.Status != http.StatusCreated || bobs.ID == alices.ID {
		t.Fatalf("bob books after the release: %d %s", r.Status, r.Body)
	}
	// An admin may release anyone's booking.
	if got := s.release("demo-admin", bobs.ID, newKey()); got.Status != 200 {
		t.Fatalf("admin releases bob's booking: %d %s", got.Status, got.Body)
	}
	assertInvariant3(t, s.DB)

	// The caller's bookings, and only theirs.
	var list pageJSON[bookingJSON]
	s.do(request{Method: "GET", Path: "/api/v1/bookings", Token: "demo-alice"}).JSON(t, &list)
	if len(list.Items) != 1 || list.Items[0].ID != alices.ID || list.Items[0].Status != "CANCELLED" {
		t.Errorf("alice's bookings: %+v", list.Items)
	}
	s.do(request{Method: "GET", Path: "/api/v1/bookings?status=CONFIRMED", Token: "demo-alice"}).JSON(t, &list)
	if len(list.Items) != 0 {
		t.Errorf("alice's confirmed bookings: %+v", list.Items)
	}
	if got := s.do(request{Method: "GET", Path: "/api/v1/bookings?status=maybe", Token: "demo-alice"}); got.Status != 400 || got.problemType() != "invalid-parameter" {
		t.Errorf("bad status: %d %s", got.Status, got.Body)
	}
}

func TestBookingRefusals(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	slotID := freeSlot(t, s.DB, 0)
	countKey := func(key string) (n int) {
		s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&n)
		return n
	}

	// Unknown slot: 404, an outcome like any other (stored, replayed).
	key := newKey()
	r := s.book("demo-alice", 999999, key, "")
	if r.Status != 404 || r.problemType() != "not-found" {
		t.Fatalf("unknown slot: %d %s", r.Status, r.Body)
	}
	assertReplay(t, r, s.book("demo-alice", 999999, key, ""))
	if got := s.release("demo-alice", 999999, newKey()); got.Status != 404 {
		t.Errorf("unknown booking: %d %s", got.Status, got.Body)
	}

	// Bad JSON, or a field the endpoint does not take: 400, nothing stored,
	// so the corrected request may use the same key.
	for _, body := range []string{`{"strategy":`, `{"strategy":"check-then-insert"}`, `[]`} {
		key := newKey()
		if r := s.book("demo-alice", slotID, key, body); r.Status != 400 || r.problemType() != "invalid-json" {
			t.Errorf("body %s: %d %s", body, r.Status, r.Body)
		}
		if n := countKey(key); n != 0 {
			t.Errorf("body %s: %d keys stored", body, n)
		}
	}
	key = newKey()
	s.book("demo-alice", slotID, key, `{`)
	if r := s.book("demo-alice", slotID, key, `{}`); r.Status != http.StatusCreated {
		t.Fatalf("the corrected request with the same key: %d %s", r.Status, r.Body)
	}
	// No key: 400.
	if r := s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/slots/%d/book", slotID), Token: "demo-bob"}); r.Status != 400 || r.problemType() != "idempotency-key-missing" {
		t.Errorf("no key: %d %s", r.Status, r.Body)
	}
	assertInvariant3(t, s.DB)
}

// formFields finds the form posting to action in an HTML page and returns
// its hidden CSRF token and idempotency key.
func formFields(t *testing.T, page []byte, action string) url.Values {
	t.Helper()
	i := bytes.Index(page, []byte(`action="`+action+`"`))
	if i < 0 {
		t.Fatalf("no form for %s", action)
	}
	form := page[i:]
	form = form[:bytes.Index(form, []byte("</form>"))]
	v := url.Values{}
	for _, m := range regexp.MustCompile(`name="(_csrf|idempotency_key)" value="([^"]+)"`).FindAllSubmatch(form, -1) {
		v.Set(string(m[1]), string(m[2]))
	}
	return v
}

func TestBookAndReleaseFromTheGrid(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	alice, bob := s.browserClient(), s.browserClient()
	s.signIn(t, alice, "alice")
	s.signIn(t, bob, "bob")
	x, y := freeSlot(t, s.DB, 0), freeSlot(t, s.DB, 1)

	grid := doWith(t, alice, s.URL, request{Method: "GET", Path: "/slots"})
	book := fmt.Sprintf("/slots/%d/book", x)
	form := formFields(t, grid.Body, book)
	if form.Get("idempotency_key") == "" || form.Get("_csrf") == "" {
		t.Fatalf("the Book form lacks its key or token: %v", form)
	}
	r := postForm(t, s, alice, book, form)
	want := fmt.Sprintf("/slots?notice=booked&slot=%d", x)
	if r.Status != http.StatusSeeOther || r.Header.Get("Location") != want {
		t.Fatalf("book: %d %s, want 303 to %s", r.Status, r.Header.Get("Location"), want)
	}
	// A double-click (same key): the same redirect, replayed; one booking.
	again := postForm(t, s, alice, book, form)
	if again.Header.Get("Location") != want || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("double-click: %d %s %v", again.Status, again.Header.Get("Location"), again.Header)
	}
	page := doWith(t, alice, s.URL, request{Method: "GET", Path: want})
	if !bytes.Contains(page.Body, []byte("Booked ")) || !bytes.Contains(page.Body, []byte(fmt.Sprintf(`data-slot-id="%d" data-state="mine"`, x))) {
		t.Fatalf("grid after booking does not show it as alice's:\n%s", page.Body)
	}

	// Bob's page was rendered while y was free; alice takes y first (API).
	bobsGrid := doWith(t, bob, s.URL, request{Method: "GET", Path: "/slots"})
	bobsForm := formFields(t, bobsGrid.Body, fmt.Sprintf("/slots/%d/book", y))
	if r := s.book("demo-alice", y, newKey(), ""); r.Status != 201 {
		t.Fatal(r.Status)
	}
	r = postForm(t, s, bob, fmt.Sprintf("/slots/%d/book", y), bobsForm)
	if r.Status != http.StatusSeeOther || !strings.Contains(r.Header.Get("Location"), "notice=slot-taken") {
		t.Fatalf("bob too late: %d %s", r.Status, r.Header.Get("Location"))
	}
	page = doWith(t, bob, s.URL, request{Method: "GET", Path: r.Header.Get("Location")})
	if page.Status != 200 || !bytes.Contains(page.Body, []byte("Someone else booked")) {
		t.Fatalf("bob's notice: %d\n%s", page.Status, page.Body)
	}

	// Alice releases x from the grid.
	var bookingID int64
	s.DB.Pool.QueryRow(context.Background(), `SELECT id FROM bookings WHERE slot_id = $1 AND status = 'CONFIRMED'`, x).Scan(&bookingID)
	cancel := fmt.Sprintf("/bookings/%d/cancel", bookingID)
	r = postForm(t, s, alice, cancel, formFields(t, page2(t, s, alice), cancel))
	if r.Status != http.StatusSeeOther || r.Header.Get("Location") != fmt.Sprintf("/slots?notice=released&slot=%d", x) {
		t.Fatalf("release: %d %s", r.Status, r.Header.Get("Location"))
	}
	// Without the CSRF token: 403, nothing booked.
	form = formFields(t, page2(t, s, bob), book)
	form.Del("_csrf")
	if r := postForm(t, s, bob, book, form); r.Status != http.StatusForbidden {
		t.Fatalf("no CSRF token: %d", r.Status)
	}
	var n int
	s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM bookings WHERE slot_id = $1 AND status = 'CONFIRMED'`, x).Scan(&n)
	if n != 0 {
		t.Fatalf("%d confirmed bookings on %d after the forged post", n, x)
	}
	assertInvariant3(t, s.DB)
}

func page2(t *testing.T, s *testServer, client *http.Client) []byte {
	t.Helper()
	return doWith(t, client, s.URL, request{Method: "GET", Path: "/slots"}).Body
}

func TestRaceLabOverHTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	client := s.browserClient()
	s.signIn(t, client, "carol")
	lab := doWith(t, client, s.URL, request{Method: "GET", Path: "/labs/race"})
	form := formFields(t, lab.Body, "/labs/race")
	form.Set("slot", "fresh")
	form.Set("racers", "8")
	form.Set("strategy", "select-for-update")
	form.Set("think_ms", "10")
	r := postForm(t, s, client, "/labs/race", form)
	if r.Status != 200 || !bytes.Contains(r.Body, []byte(`data-won="1" data-refused="7" data-failed="0"`)) ||
		!bytes.Contains(r.Body, []byte(`data-ok="true"`)) {
		t.Fatalf("race: %d\n%s", r.Status, r.Body)
	}
	form.Set("racers", "65")
	if r := postForm(t, s, client, "/labs/race", form); r.Status != 422 || !bytes.Contains(r.Body, []byte("from 2 to 64")) {
		t.Fatalf("65 racers: %d\n%s", r.Status, r.Body)
	}
	// The racers are users, but not on the sign-in page; the lab's slots
	// are slots, but not in the demo grid.
	if signin := doWith(t, client, s.URL, request{Method: "GET", Path: "/signin"}); bytes.Contains(signin.Body, []byte(labs.RacerPrefix)) {
		t.Errorf("racers listed on the sign-in page")
	}
	if grid := doWith(t, client, s.URL, request{Method: "GET", Path: "/slots"}); bytes.Contains(grid.Body, []byte(labs.RaceResource)) {
		t.Errorf("the lab's slot shows in the grid")
	}
	assertInvariant3(t, s.DB)
}

// An admin arms "abandon" at after_outbox_insert, the events' own crash
// point: run() hands its crash switch to the one events.Writer every
// workflow writes through, so a booking is cut off after its event's
// insert and before its commit — no booking, no event, no key — and the
// same key books once disarmed.
func TestAbandonAfterOutboxInsertLosesTheBookingAndItsEvent(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-admin",
		Body: `{"at":"after_outbox_insert","mode":"abandon","once":true}`}); r.Status != 200 {
		t.Fatalf("arm: %d %s", r.Status, r.Body)
	}
	slotID := freeSlot(t, s.DB, 0)
	ctx := context.Background()
	var eventsBefore int
	s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&eventsBefore)
	// A body the Transport cannot rewind: one attempt, so the cut is seen.
	req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/v1/slots/%d/book", s.URL, slotID), io.NopCloser(strings.NewReader("")))
	req.Header.Set("Authorization", "Bearer demo-alice")
	req.Header.Set("Idempotency-Key", "cut-after-the-outbox")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("abandoned booking answered %d", resp.StatusCode)
	}
	var bookings, outbox, keys int
	s.DB.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM bookings WHERE slot_id = $1),
	                                (SELECT count(*) FROM outbox) - $2,
	                                (SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'cut-after-the-outbox')`,
		slotID, eventsBefore).Scan(&bookings, &outbox, &keys)
	if bookings != 0 || outbox != 0 || keys != 0 {
		t.Fatalf("after the cut: %d bookings, %d new events, %d keys; want none", bookings, outbox, keys)
	}
	if r := s.book("demo-alice", slotID, "cut-after-the-outbox", ""); r.Status != http.StatusCreated {
		t.Fatalf("the same key once disarmed: %d %s", r.Status, r.Body)
	}
}
