package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/web"
)

// The hostile-input suite: every route of internal/web/routes.go, each
// with the refusals that apply to it — wrong methods, missing and foreign
// credentials, hostile path parameters and query strings, hostile
// idempotency keys, bodies over the limit (plain and chunked), wrong
// content types, broken and hostile JSON, NUL and invalid UTF-8 in every
// stored text field, forms without or with a foreign CSRF token, a cookie
// replayed after sign-out, hostile X-Request-Id — and for every answer:
// a precise 4xx (problem+json for the API, an HTML page for pages), never a
// 5xx, no internals, and the database unchanged (every table, compared
// before and after each request).
//
// The routes come from the app itself (web.App.Routes): a route added
// without an entry in hostileRoutes fails the suite.

// access is who may call a route.
type access int

const (
	public    access = iota // anyone
	bearer                  // any API token
	adminAPI                // the admin's API token
	pageAny                 // a browser page, signed in or not
	signedIn                // a browser page for a signed-in user
	adminPage               // a browser page for the admin
)

// fixture names a valid path parameter, set up before the suite runs.
type fixture int

const (
	noParam        fixture = iota
	alicePolicy            // an ACTIVE policy of alice's (owned: IDOR both ways)
	aliceOperation         // an operation of alice's (owned)
	aliceBooking           // a confirmed booking of alice's (owned)
	aFreeSlot              // a free slot (anyone may book it)
	anyOperation           // an operation, for admin routes
	anEvent                // an event id (a UUID), for admin routes
	aLab                   // a lab's name (the :name of /labs/:name)
	aliceLabRun            // a run of the claim lab by alice (owned)
	aDoc                   // a document's name (the :name of /docs/:name)
)

// routeSpec is what the suite knows of one route.
type routeSpec struct {
	access access
	param  fixture
	keyed  bool     // Idempotency-Key header (API) or idempotency_key field (form)
	json   bool     // takes a JSON body
	text   []string // free-text fields that are stored, JSON or form
	form   url.Values
	query  []string // query parameters it parses
	// validJSON is a body that passes validation, into which a text field's
	// hostile value is put.
	validJSON map[string]any
}

var hostileRoutes = map[string]routeSpec{
	"GET /healthz":         {access: public},
	"GET /readyz":          {access: public},
	"GET /metrics":         {access: public},
	"GET /static*":         {access: public},
	"GET /static/*":        {access: public},
	"GET /favicon.ico":     {access: public},
	"GET /":                {access: pageAny},
	"GET /signin":          {access: pageAny},
	"POST /signin":         {access: pageAny, text: []string{"name"}, form: url.Values{"name": {"alice"}}},
	"POST /signout":        {access: pageAny},
	"GET /recovery":        {access: pageAny},
	"GET /recovery/panel":  {access: pageAny},
	"GET /code":            {access: pageAny},
	"GET /code/*":          {access: pageAny},
	"GET /static/code.css": {access: public},
	"GET /docs":            {access: pageAny},
	"GET /docs/":           {access: pageAny},
	"GET /docs/:name":      {access: pageAny, param: aDoc},

	"GET /ideas/retry-is-not-recovery":           {access: pageAny},
	"GET /ideas/crash-between-effect-and-record": {access: pageAny},
	// the signed callbacks: no credentials but the signature (internal/web's
	// TestWebhookRouteRefusesForgedStaleAndMalformedCallbacks has its own cases)
	"POST /webhooks/:system": {access: public},

	"GET /api/v1/policies":                         {access: bearer, query: []string{"limit", "cursor", "status"}},
	"GET /api/v1/policies/:id":                     {access: bearer, param: alicePolicy},
	"POST /api/v1/policies/:id/cancel":             {access: bearer, param: alicePolicy, keyed: true, json: true, text: []string{"reason"}, validJSON: map[string]any{"reason": "ok"}},
	"GET /api/v1/operations":                       {access: bearer, query: []string{"limit", "cursor", "status", "kind", "user", "waiting_on", "since", "until", "finished_since", "finished_until"}},
	"GET /api/v1/operations/:id":                   {access: bearer, param: aliceOperation},
	"GET /api/v1/slots":                            {access: bearer, query: []string{"limit", "cursor", "status"}},
	"POST /api/v1/slots/:id/book":                  {access: bearer, param: aFreeSlot, keyed: true, json: true, validJSON: map[string]any{}},
	"GET /api/v1/bookings":                         {access: bearer, query: []string{"limit", "cursor", "status"}},
	"GET /api/v1/bookings/:id":                     {access: bearer, param: aliceBooking},
	"POST /api/v1/bookings/:id/cancel":             {access: bearer, param: aliceBooking, keyed: true, json: true, validJSON: map[string]any{}},
	"GET /api/v1/recovery":                         {access: bearer},
	"GET /api/v1/users":                            {access: adminAPI},
	"GET /api/v1/invariants":                       {access: adminAPI, query: []string{"stale_after"}},
	"GET /api/v1/admin/reconciliation":             {access: adminAPI},
	"POST /api/v1/admin/operations/:id/resume":     {access: adminAPI, param: anyOperation, keyed: true},
	"POST /api/v1/operations/:id/cancel":           {access: adminAPI, param: anyOperation, keyed: true},
	"POST /api/v1/admin/operations/:id/retry-from": {access: adminAPI, param: anyOperation, keyed: true, json: true, text: []string{"step", "note"}, validJSON: map[string]any{"step": "refund", "seen_updated_at": "2026-01-01T00:00:00Z", "note": "ok"}},
	"POST /api/v1/admin/operations/:id/resolve":    {access: adminAPI, param: anyOperation, keyed: true, json: true, text: []string{"note"}, validJSON: map[string]any{"action": "retry", "seen_updated_at": "2026-01-01T00:00:00Z", "note": "ok"}},
	"GET /api/v1/reconciliation":                   {access: adminAPI, query: []string{"reason", "truth"}},
	"GET /api/v1/reconciliation/decisions":         {access: adminAPI, query: []string{"operation_id", "limit", "cursor"}},
	"POST /api/v1/reconciliation/decisions": {access: adminAPI, keyed: true, json: true, text: []string{"note"}, validJSON: map[string]any{
		"decisions": []any{map[string]any{"operation_id": 1, "action": "retry", "seen_updated_at": "2026-01-01T00:00:00Z"}}, "note": "ok"}},
	"POST /api/v1/reconciliation/ask":             {access: adminAPI, json: true, validJSON: map[string]any{"operation_ids": []any{1}}},
	"GET /api/v1/reconciliation/items/:id":        {access: adminAPI, param: anyOperation},
	"POST /api/v1/admin/reset":                    {access: adminAPI, json: true, validJSON: map[string]any{"users": 0}},
	"GET /api/v1/admin/crash":                     {access: adminAPI},
	"GET /api/v1/events":                          {access: adminAPI, query: []string{"status"}},
	"GET /api/v1/mailbox":                         {access: bearer},
	"GET /api/v1/admin/events/injector":           {access: adminAPI},
	"PUT /api/v1/admin/events/injector":           {access: adminAPI, json: true, text: []string{"mode", "consumer"}, validJSON: map[string]any{"mode": ""}},
	"POST /api/v1/admin/events/:id/replay":        {access: adminAPI, param: anEvent, keyed: true},
	"PUT /api/v1/admin/crash":                     {access: adminAPI, json: true, text: []string{"at", "mode"}, validJSON: map[string]any{"at": ""}},
	"POST /api/v1/admin/operations/:id/end-lease": {access: adminAPI, param: anyOperation}, // its operation is finished: 409, nothing written
	"GET /api/v1/provider/faults":                 {access: adminAPI},
	"PUT /api/v1/provider/faults":                 {access: adminAPI, json: true, text: []string{"mode", "status_mode"}, validJSON: map[string]any{"mode": "ok"}},
	"GET /api/v1/provider/effects":                {access: adminAPI},
	"POST /api/v1/provider/reset":                 {access: adminAPI},
	"GET /api/v1/payments/faults":                 {access: adminAPI},
	"PUT /api/v1/payments/faults":                 {access: adminAPI, json: true, text: []string{"mode", "status_mode"}, validJSON: map[string]any{"mode": "ok"}},
	"GET /api/v1/payments/ledger":                 {access: adminAPI},
	"POST /api/v1/payments/reset":                 {access: adminAPI},
	"GET /api/v1/provider/webhooks":               {access: adminAPI},
	"PUT /api/v1/provider/webhooks":               {access: adminAPI, json: true, text: []string{"mode"}, validJSON: map[string]any{"mode": "off"}},
	"GET /api/v1/payments/webhooks":               {access: adminAPI},
	"PUT /api/v1/payments/webhooks":               {access: adminAPI, json: true, text: []string{"mode"}, validJSON: map[string]any{"mode": "off"}},
	"GET /api/v1/labs":                            {access: bearer},
	"GET /api/v1/labs/:name/runs":                 {access: bearer, param: aLab},
	"POST /api/v1/labs/:name/runs":                {access: bearer, param: aLab, keyed: true, json: true, validJSON: map[string]any{}},
	"GET /api/v1/labs/:name/runs/:id":             {access: bearer, param: aliceLabRun},
	"GET /api/v1/admin/systems":                   {access: adminAPI},
	"PUT /api/v1/admin/systems/:name":             {access: adminAPI, json: true, validJSON: map[string]any{"believed_idempotent": true}},

	"GET /policies":                       {access: signedIn},
	"GET /policies/:id":                   {access: signedIn, param: alicePolicy},
	"POST /policies/:id/cancel":           {access: signedIn, param: alicePolicy, keyed: true, text: []string{"reason"}, form: url.Values{"reason": {"ok"}}},
	"POST /policies/:id/double-click":     {access: signedIn, param: alicePolicy, form: url.Values{"mode": {"same-key"}}},
	"GET /operations":                     {access: signedIn, query: []string{"limit", "cursor", "status", "kind", "user", "waiting_on", "since", "until", "finished_since", "finished_until"}},
	"GET /operations/:id":                 {access: signedIn, param: aliceOperation},
	"GET /operations/:id/panel":           {access: signedIn, param: aliceOperation},
	"GET /slots":                          {access: signedIn},
	"POST /slots/:id/book":                {access: signedIn, param: aFreeSlot, keyed: true},
	"POST /bookings/:id/cancel":           {access: signedIn, param: aliceBooking, keyed: true},
	"GET /bookings/:id":                   {access: signedIn, param: aliceBooking},
	"GET /provider":                       {access: signedIn},
	"GET /payments":                       {access: signedIn},
	"GET /labs":                           {access: signedIn},
	"GET /labs/race":                      {access: signedIn},
	"POST /labs/race":                     {access: signedIn, text: []string{"slot", "strategy"}, form: url.Values{"slot": {"fresh"}, "racers": {"2"}, "strategy": {"conditional-update"}, "think_ms": {"0"}}},
	"GET /labs/:name":                     {access: signedIn, param: aLab},
	"POST /labs/:name/runs":               {access: signedIn, param: aLab, keyed: true},
	"GET /labs/:name/runs/:id":            {access: signedIn, param: aliceLabRun},
	"GET /labs/:name/runs/:id/operations": {access: signedIn, param: aliceLabRun},
	"POST /provider/faults":               {access: adminPage, text: []string{"mode", "status_mode"}, form: url.Values{"mode": {"ok"}}},
	"POST /provider/reset":                {access: adminPage},
	"POST /payments/faults":               {access: adminPage, text: []string{"mode", "status_mode"}, form: url.Values{"mode": {"ok"}}},
	"POST /payments/reset":                {access: adminPage},
	"POST /provider/webhooks":             {access: adminPage, text: []string{"mode"}, form: url.Values{"mode": {"off"}}},
	"POST /payments/webhooks":             {access: adminPage, text: []string{"mode"}, form: url.Values{"mode": {"off"}}},
	"GET /reconciliation":                 {access: adminPage, query: []string{"resolved", "action", "reason", "truth", "asked", "answered", "decided", "changed", "refused"}},
	"GET /events":                         {access: signedIn},
	"POST /events/injector":               {access: adminPage, text: []string{"mode", "consumer"}, form: url.Values{"mode": {""}, "count": {"1"}}},
	"POST /events/:id/replay":             {access: adminPage, param: anEvent, keyed: true},
	"POST /operations/:id/resume":         {access: adminPage, param: anyOperation, keyed: true},
	"POST /operations/:id/cancel":         {access: adminPage, param: anyOperation, keyed: true},
	"POST /operations/:id/retry-from":     {access: adminPage, param: anyOperation, keyed: true, text: []string{"step", "note"}, form: url.Values{"step": {"refund"}, "seen_updated_at": {"2026-01-01T00:00:00Z"}, "note": {"ok"}}},
	"POST /reconciliation/:id/resolve":    {access: adminPage, param: anyOperation, keyed: true, text: []string{"note"}, form: url.Values{"action": {"retry"}, "seen_updated_at": {"2026-01-01T00:00:00Z"}, "note": {"ok"}}},
	"GET /reconciliation/badge":           {access: adminPage},
	"GET /reconciliation/items/:id":       {access: adminPage, param: anyOperation},
	"POST /reconciliation/ask":            {access: adminPage, form: url.Values{"id": {"1"}}},
	"POST /reconciliation/decide": {access: adminPage, keyed: true, text: []string{"note"}, form: url.Values{
		"action": {"retry"}, "item": {"1|2026-01-01T00:00:00Z|UNKNOWN"}, "note": {"ok"}}},
	"GET /admin/demo":                      {access: adminPage},
	"POST /admin/reset":                    {access: adminPage}, // never with confirm=reset: every case must write nothing
	"POST /admin/crash":                    {access: adminPage, text: []string{"at"}, form: url.Values{"at": {""}}},
	"POST /admin/operations/:id/end-lease": {access: adminPage, param: anyOperation},
}

// Hostile values.
var (
	hostileIDs = []string{"0", "-1", "abc", "1.5", "1e3", "99999999999999999999", "9223372036854775808", "%20",
		"1%20OR%201=1", "1';DROP%20TABLE%20users;--", "..%2F..%2Fetc%2Fpasswd", "%00", "%EF%BC%91", "0x10", "+1"}
	hostileQuery = []string{"0", "-1", "1001", "99999999999999999999", "x", "%00", "%FF", "'%20OR%201=1", "..%2F", "LTU", "OTk5OTk5OTk5OTk5OTk5OTk5OTk"}
	hostileKeys  = map[string]string{
		"oversized": strings.Repeat("k", 256),
		"non-ASCII": "ключ-1",
		"space":     "a key",
		"tab":       "a\tkey",

		"bad escape": `"a\b"`,
		"latin-1":    "key\xe9",
	}
	hostileText = map[string]string{
		"NUL":           "a\x00b",
		"control":       "a\x07b",
		"invalid UTF-8": "a\xff\xfeb",
		"too long":      strings.Repeat("x", 600),
	}
)

// hostileCase is one request and what its answer may be.
type hostileCase struct {
	route, name string
	method      string
	path        string
	token       string
	header      map[string]string
	body        string
	chunked     bool
	cookies     map[string]string // sent as the Cookie header; nil: none
	want        []int
	problem     string // the problem type an API answer must have ("": any 4xx problem)
	stored      bool   // a business refusal the idempotency protocol stores: idempotency_keys may gain a row
}

// suiteWorld is what the cases are built from.
type suiteWorld struct {
	s                  *testServer
	ids                map[fixture][2]string // alice's, bob's
	alice, bob, admin  map[string]string     // session cookies
	aliceCSRF, bobCSRF string
	adminCSRF          string
	replayed           map[string]string // a signed-out session's cookies
	replayedCSRF       string
	bodyLimit          int
}

func TestHostileInputOnEveryRoute(t *testing.T) {
	t.Parallel()
	off := "off"
	s := startServer(t, map[string]string{
		// The limits have their own tests; here they would only turn refusals into 429s.
		"RATE_LIMIT_SIGNIN": off, "RATE_LIMIT_BAD_TOKEN": off, "RATE_LIMIT_WRITES_PER_USER": off,
		"RATE_LIMIT_WRITES_PER_ADDRESS": off, "RATE_LIMIT_LABS": off,
		"BODY_LIMIT": "64K", "RECOVERY_INTERVAL": "1h", "PROVIDER_TIMEOUT": "5s",
		"EVENTS_WORKERS": off, // nothing delivers the fixtures' events behind the snapshots
	})
	w := setUpWorld(t, s)

	routes := servedRoutes(t, s)
	var missing []string
	for key := range routes {
		if _, ok := hostileRoutes[key]; !ok {
			missing = append(missing, key)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("routes without hostile cases (add them to hostileRoutes in hostile_test.go):\n  %s", strings.Join(missing, "\n  "))
	}

	var cases []hostileCase
	for key, methods := range routes {
		cases = append(cases, w.casesFor(key, hostileRoutes[key], methods)...)
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].route+cases[i].name < cases[j].route+cases[j].name })

	perRoute := map[string]int{}
	before := snapshotDB(t, s.DB.Pool)
	for _, tc := range cases {
		perRoute[tc.route]++
		r := w.send(t, tc)
		w.check(t, tc, r)
		after := snapshotDB(t, s.DB.Pool)
		if d := before.diff(after); d != "" {
			if tc.stored && onlyKeysChanged(before, after) {
				before = after // a stored refusal: the protocol's own record, nothing else
				continue
			}
			t.Errorf("%s — %s: the database changed:\n%s", tc.route, tc.name, d)
			before = after
		}
	}
	t.Logf("hostile suite: %d routes, %d requests", len(perRoute), len(cases))
	for key := range routes {
		if perRoute[key] < 3 {
			t.Errorf("%s: only %d hostile cases", key, perRoute[key])
		}
	}
}

func onlyKeysChanged(before, after dbSnapshot) bool {
	for n, st := range before {
		if after[n] != st && n != "public.idempotency_keys" {
			return false
		}
	}
	return len(before) == len(after)
}

// servedRoutes is every "METHOD path" the app serves, grouped by path
// ("GET /x" → all methods of /x).
func servedRoutes(t *testing.T, s *testServer) map[string][]string {
	t.Helper()
	app := web.New(web.Config{BodyLimit: "1M", DemoMode: true}, web.Deps{
		Logger: slog.New(slog.DiscardHandler), Pool: s.DB.Pool, Registry: prometheus.NewRegistry(),
	})
	byPath := map[string][]string{}
	for _, r := range app.Routes() {
		if !strings.HasPrefix(r.Path, "/") {
			continue // Echo's internal entries
		}
		byPath[r.Path] = append(byPath[r.Path], r.Method)
	}
	out := map[string][]string{}
	for path, methods := range byPath {
		for _, m := range methods {
			out[m+" "+path] = methods
		}
	}
	return out
}

func setUpWorld(t *testing.T, s *testServer) *suiteWorld {
	t.Helper()
	w := &suiteWorld{s: s, ids: map[fixture][2]string{}, bodyLimit: 64000}
	// Alice and bob each: an ACTIVE policy, a cancelled one (its operation), a booking.
	var ops [2]string
	var books [2]string
	var labRuns [2]string
	for i, who := range []string{"demo-alice", "demo-bob"} {
		pol := s.policyOf(t, who, 1)
		r := s.do(cancelReq(pol, who, "setup-cancel-"+who, ""))
		var op struct{ ID int64 }
		r.JSON(t, &op)
		ops[i] = fmt.Sprint(op.ID)
		r = s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/slots/%d/book", 10+i), Token: who, Header: map[string]string{"Idempotency-Key": "setup-book-" + who}})
		var b struct{ ID int64 }
		r.JSON(t, &b)
		books[i] = fmt.Sprint(b.ID)
		r = s.do(request{Method: "POST", Path: "/api/v1/labs/claim/runs", Token: who, Header: map[string]string{"Idempotency-Key": "setup-lab-" + who}})
		var run struct{ ID int64 }
		r.JSON(t, &run)
		labRuns[i] = fmt.Sprint(run.ID)
	}
	w.ids[alicePolicy] = [2]string{fmt.Sprint(s.policyOf(t, "demo-alice", 0)), fmt.Sprint(s.policyOf(t, "demo-bob", 0))}
	w.ids[aliceOperation] = ops
	w.ids[aliceBooking] = books
	w.ids[aFreeSlot] = [2]string{"20", "21"}
	w.ids[anyOperation] = ops
	w.ids[anEvent] = [2]string{"01a2381f-0267-70c7-8d90-7303ae0ed5f0", "01a2381f-0267-70c7-8d90-7303ae0ed5f1"}
	w.ids[aLab] = [2]string{hostileLab, hostileLab}
	w.ids[aliceLabRun] = labRuns
	w.ids[aDoc] = [2]string{"recovery", "README"}

	signedIn := func(name string) (map[string]string, string) {
		client := s.browserClient()
		s.signIn(t, client, name)
		page := doWith(t, client, s.URL, request{Method: "GET", Path: "/labs"})
		u, _ := url.Parse(s.URL)
		cookies := map[string]string{}
		for _, ck := range client.Jar.Cookies(u) {
			cookies[ck.Name] = ck.Value
		}
		return cookies, string(csrfInput.FindSubmatch(page.Body)[1])
	}
	w.alice, w.aliceCSRF = signedIn("alice")
	w.bob, w.bobCSRF = signedIn("bob")
	w.admin, w.adminCSRF = signedIn("admin")
	w.replayed, w.replayedCSRF = signedIn("alice")
	form := url.Values{"_csrf": {w.replayedCSRF}}
	if r := withCookies(t, s.URL, request{Method: "POST", Path: "/signout", Body: form.Encode(),
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, w.replayed); r.Status != http.StatusSeeOther {
		t.Fatalf("sign out the replayed session: %d", r.Status)
	}
	return w
}

// hostileLab is the lab whose name fills :name where the case is about :id.
const hostileLab = "claim"

// pathWith puts value into the route's :id — or, in a route without one,
// into its :name (a lab's).
func pathWith(route, value string) string {
	if strings.Contains(route, ":id") {
		return strings.Replace(strings.Replace(route, ":id", value, 1), ":name", hostileLab, 1)
	}
	return strings.Replace(route, ":name", value, 1)
}

// who is the credential a case is sent with when it should pass
// authentication: the token, or the cookies and CSRF token.
func (w *suiteWorld) credentials(spec routeSpec) (token string, cookies map[string]string, csrf string) {
	switch spec.access {
	case bearer:
		return "demo-alice", nil, ""
	case adminAPI:
		return "demo-admin", nil, ""
	case adminPage:
		return "", w.admin, w.adminCSRF
	default:
		return "", w.alice, w.aliceCSRF
	}
}

// apiPath: the JSON API and the callbacks answer problem+json; the rest are pages.
func apiPath(p string) bool {
	return strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/webhooks/")
}

// casesFor builds the hostile cases of one route.
func (w *suiteWorld) casesFor(key string, spec routeSpec, methods []string) []hostileCase {
	method, route, _ := strings.Cut(key, " ")
	api := apiPath(route)
	token, cookies, csrf := w.credentials(spec)
	path := route
	if spec.param != noParam {
		path = pathWith(route, w.ids[spec.param][0])
	}
	path = strings.Replace(path, ":system", "provider", 1) // the callbacks' route: a system that calls back
	if strings.Contains(route, "*") {
		path = strings.Replace(strings.TrimSuffix(route, "*"), "/*", "/", 1) + "app.css"
		path = strings.ReplaceAll(path, "//", "/")
		if strings.HasPrefix(route, "/code/") {
			path = "/code/go.mod" // the code viewer: a file of the embedded tree
		} else if !strings.HasPrefix(path, "/static/") {
			path = "/static/app.css"
		}
	}
	var cs []hostileCase
	add := func(c hostileCase) {
		c.route = key
		if c.method == "" {
			c.method = method
		}
		if c.path == "" {
			c.path = path
		}
		cs = append(cs, c)
	}
	// A request that passes everything up to what the case changes.
	base := func() hostileCase {
		c := hostileCase{token: token, cookies: cookies, header: map[string]string{}}
		if spec.keyed && api {
			c.header["Idempotency-Key"] = "hostile-" + newKeySuffix()
		}
		return c
	}
	formBody := func(csrfToken string, extra url.Values) string {
		f := url.Values{}
		for k, v := range spec.form {
			f[k] = v
		}
		if csrfToken != "" {
			f.Set("_csrf", csrfToken)
		}
		if spec.keyed {
			f.Set("idempotency_key", "hostile-"+newKeySuffix())
		}
		for k, v := range extra {
			f[k] = v
		}
		return f.Encode()
	}
	unsafe := method != http.MethodGet && method != http.MethodHead
	pageForm := !api && unsafe

	// Wrong methods: 405 with Allow, on every path.
	for _, m := range []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"} {
		if slices.Contains(methods, m) {
			continue
		}
		if strings.Contains(route, "*") && m != "POST" && m != "OPTIONS" {
			continue
		}
		c := base()
		c.name, c.method, c.want, c.problem = "method "+m, m, []int{405}, "method-not-allowed"
		add(c)
	}

	// X-Request-Id of invalid UTF-8: replaced (checked in check), never a 5xx.
	c := base()
	c.name, c.header["X-Request-Id"], c.want = "hostile X-Request-Id", "id-\xff\xfe", nil
	if unsafe { // keep it a refusal: no credentials
		c.token, c.cookies = "", nil
	}
	add(c)

	// Credentials.
	switch spec.access {
	case bearer, adminAPI:
		for name, auth := range map[string]string{"no token": "", "bad token": "Bearer not-a-token", "basic auth": "Basic YWxpY2U6eA==", "token with NUL": "Bearer demo-alice%00"} {
			c := base()
			c.name, c.token, c.header["Authorization"], c.want, c.problem = name, "", auth, []int{401}, "unauthenticated"
			add(c)
		}
		if spec.access == adminAPI {
			c := base()
			c.name, c.token, c.want, c.problem = "customer token on an admin route", "demo-alice", []int{403}, "forbidden"
			add(c)
		}
	case signedIn, adminPage:
		c := base()
		c.name, c.cookies, c.want = "signed out", nil, []int{303, 403}
		add(c)
		c = base()
		c.name, c.cookies, c.want = "cookie replayed after sign-out", w.replayed, []int{303, 403}
		if pageForm {
			c.body = formBody(w.replayedCSRF, nil)
		}
		add(c)
		if spec.access == adminPage {
			c := base()
			c.name, c.cookies, c.want = "customer on an admin page", w.alice, []int{403}
			if pageForm {
				c.body = formBody(w.aliceCSRF, nil)
			}
			add(c)
		}
	}

	// Forms: CSRF.
	if pageForm {
		c := base()
		c.name, c.body, c.want = "form without CSRF token", formBody("", nil), []int{403}
		add(c)
		c = base()
		c.name, c.body, c.want = "form with another session's CSRF token", formBody(w.bobCSRF, nil), []int{403}
		add(c)
		c = base()
		c.name, c.body, c.want = "form with a forged CSRF token", formBody("forged-"+strings.Repeat("A", 40), nil), []int{403}
		add(c)
		c = base()
		c.name, c.header["Content-Type"], c.body, c.want = "JSON to a form route", "application/json", `{"_csrf":"`+csrf+`"}`, []int{403}
		add(c)
	}

	// Path parameters: hostile values, and IDOR both ways.
	if spec.param != noParam {
		for _, v := range hostileIDs {
			c := base()
			c.name, c.path, c.want = "path id "+v, pathWith(route, v), []int{404}
			c.problem = "not-found"
			if pageForm {
				c.body = formBody(csrf, nil)
			}
			add(c)
		}
		owned := spec.param == alicePolicy || spec.param == aliceOperation || spec.param == aliceBooking || spec.param == aliceLabRun
		if owned {
			for _, idor := range []struct{ name, id, token string }{
				{"IDOR: bob's resource as alice", w.ids[spec.param][1], "demo-alice"},
				{"IDOR: alice's resource as bob", w.ids[spec.param][0], "demo-bob"},
			} {
				c := base()
				c.name, c.path, c.want, c.problem, c.stored = idor.name, pathWith(route, idor.id), []int{404}, "not-found", spec.keyed
				if api {
					c.token = idor.token
				} else {
					token := w.aliceCSRF
					c.cookies = w.alice
					if idor.token == "demo-bob" {
						c.cookies, token = w.bob, w.bobCSRF
					}
					if pageForm {
						c.body = formBody(token, nil)
					}
				}
				add(c)
			}
		}
	}

	// Query strings.
	for _, q := range spec.query {
		for _, v := range hostileQuery {
			c := base()
			c.name, c.path = "query "+q+"="+v, path+"?"+q+"="+v
			if api {
				c.want, c.problem = []int{200, 400}, ""
			}
			add(c)
		}
	}

	// Idempotency keys.
	if spec.keyed && api {
		c := base()
		delete(c.header, "Idempotency-Key")
		c.name, c.want, c.problem = "no Idempotency-Key", []int{400}, "idempotency-key-missing"
		add(c)
		for name, k := range hostileKeys {
			c := base()
			c.name, c.header["Idempotency-Key"], c.want, c.problem = "key "+name, k, []int{400}, "idempotency-key-malformed"
			add(c)
		}
	}
	if spec.keyed && pageForm {
		f := url.Values{"_csrf": {csrf}}
		for k, v := range spec.form {
			f[k] = v
		}
		c := base()
		c.name, c.body, c.want = "form without idempotency_key", f.Encode(), []int{400}
		add(c)
		f.Set("idempotency_key", hostileKeys["non-ASCII"])
		c = base()
		c.name, c.body, c.want = "form with a non-ASCII idempotency_key", f.Encode(), []int{400}
		add(c)
	}

	// Bodies.
	if unsafe && !strings.Contains(route, "*") {
		big := strings.Repeat("x", w.bodyLimit+1)
		for _, chunked := range []bool{false, true} {
			c := base()
			c.name, c.chunked, c.want, c.problem = fmt.Sprintf("body over the limit (chunked %v)", chunked), chunked, []int{413}, "body-too-large"
			if api {
				c.body = `{"reason":"` + big + `"}`
			} else {
				c.body = formBody(csrf, url.Values{"reason": {big}})
			}
			add(c)
		}
	}
	if spec.json {
		jsonCase := func(name, ct, body string, want int, typ string) {
			c := base()
			c.name, c.body, c.want, c.problem = name, body, []int{want}, typ
			if ct != "" {
				c.header["Content-Type"] = ct
			}
			add(c)
		}
		jsonCase("text/plain body", "text/plain", `{}`, 415, "unsupported-media-type")
		jsonCase("form body", "application/x-www-form-urlencoded", "reason=x", 415, "unsupported-media-type")
		jsonCase("no content type", "-", `{}`, 415, "unsupported-media-type")
		jsonCase("invalid JSON", "", `{"reason":`, 400, "invalid-json")
		jsonCase("trailing data", "", `{} {}`, 400, "invalid-json")
		jsonCase("unknown field", "", `{"zzz_not_a_field": 1}`, 400, "invalid-json")
		jsonCase("array, not object", "", `[1, 2]`, 400, "invalid-json")
		jsonCase("deeply nested", "", `{"zzz":`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`}`, 400, "invalid-json")
		jsonCase("invalid UTF-8", "", "{\"zzz\": \"\xff\"}", 400, "invalid-json")
		for _, field := range spec.text {
			for name, v := range hostileText {
				body := map[string]any{}
				for k, val := range spec.validJSON {
					body[k] = val
				}
				body[field] = v
				c := base()
				c.name, c.body = field+": "+name, jsonString(body)
				c.want = []int{400, 422}
				add(c)
			}
		}
	}
	if pageForm {
		for _, field := range spec.text {
			for name, v := range hostileText {
				c := base()
				c.name, c.body, c.want = "form "+field+": "+name, formBody(csrf, url.Values{field: {v}}), []int{400, 422}
				add(c)
			}
		}
	}
	return cs
}

// jsonString encodes v keeping invalid UTF-8 as raw bytes (encoding/json
// would replace it), the way a hostile client sends it.
func jsonString(v map[string]any) string {
	var b strings.Builder
	b.WriteString("{")
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%q:", k)
		switch x := v[k].(type) {
		case string:
			b.WriteString(`"`)
			for _, ch := range []byte(x) {
				switch {
				case ch == '"' || ch == '\\':
					b.WriteByte('\\')
					b.WriteByte(ch)
				case ch < 0x20:
					fmt.Fprintf(&b, `\u%04x`, ch)
				default:
					b.WriteByte(ch)
				}
			}
			b.WriteString(`"`)
		default:
			fmt.Fprint(&b, x)
		}
	}
	b.WriteString("}")
	return b.String()
}

var keyCounter struct{ n int }

func newKeySuffix() string {
	keyCounter.n++
	return fmt.Sprintf("%d-%d", time.Now().UnixNano(), keyCounter.n)
}

// send sends one case.
func (w *suiteWorld) send(t *testing.T, tc hostileCase) response {
	t.Helper()
	var body io.Reader
	if tc.body != "" {
		body = strings.NewReader(tc.body)
		if tc.chunked {
			body = chunked{body}
		}
	}
	req, err := http.NewRequest(tc.method, w.s.URL+tc.path, body)
	if err != nil {
		t.Fatalf("%s — %s: %v", tc.route, tc.name, err)
	}
	if tc.token != "" {
		req.Header.Set("Authorization", "Bearer "+tc.token)
	}
	if tc.body != "" {
		if apiPath(tc.path) {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	}
	for k, v := range tc.header {
		if k == "Content-Type" && v == "-" {
			req.Header.Del(k)
			continue
		}
		req.Header[http.CanonicalHeaderKey(k)] = []string{v}
	}
	var parts []string
	for k, v := range tc.cookies {
		parts = append(parts, k+"="+v)
	}
	if len(parts) > 0 {
		req.Header.Set("Cookie", strings.Join(parts, "; "))
	}
	resp, err := noRedirectClient(nil).Do(req)
	if err != nil {
		t.Fatalf("%s — %s: %v", tc.route, tc.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// check asserts what every answer of the suite must be.
func (w *suiteWorld) check(t *testing.T, tc hostileCase, r response) {
	t.Helper()
	what := tc.route + " — " + tc.name
	if r.Status >= 500 {
		t.Errorf("%s: %d %s", what, r.Status, r.Body)
		return
	}
	if len(tc.want) > 0 && !slices.Contains(tc.want, r.Status) {
		t.Errorf("%s: %d, want %v: %s", what, r.Status, tc.want, short(r.Body))
	}
	if r.Status >= 400 { // a refusal says nothing of the code (a page's own prose may say "idempotency: …")
		assertNoInternals(t, what, string(r.Body))
	}
	assertSecurityHeaders(t, what, r.Header)
	if id := r.Header.Get("X-Request-Id"); !validRequestIDForTest(id) {
		t.Errorf("%s: X-Request-Id %q", what, id)
	}
	if r.Status < 400 || tc.method == http.MethodHead {
		return
	}
	ct := r.Header.Get("Content-Type")
	if apiPath(tc.path) {
		if ct != "application/problem+json" {
			t.Errorf("%s: Content-Type %q, want application/problem+json", what, ct)
			return
		}
		if tc.problem != "" && r.problemType() != tc.problem {
			t.Errorf("%s: problem %s, want %s", what, short(r.Body), tc.problem)
		}
	} else if !strings.HasPrefix(ct, "text/html") {
		t.Errorf("%s: Content-Type %q, want an HTML page", what, ct)
	}
	if r.Status == http.StatusMethodNotAllowed && r.Header.Get("Allow") == "" {
		t.Errorf("%s: 405 without Allow", what)
	}
}

func short(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(bytes.TrimSpace(b))
}
