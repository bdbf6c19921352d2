package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// Names on the wire.
const (
	// HeaderName carries the key on JSON routes (IETF Idempotency-Key draft).
	HeaderName = "Idempotency-Key"
	// FormField carries the key in browser forms, minted when the form renders.
	FormField = "idempotency_key"
	// ReplayedHeader marks a response sent again from the store.
	ReplayedHeader = "Idempotent-Replayed"
	// MaxKeyLength is the longest key accepted, in bytes (= characters: ASCII).
	MaxKeyLength = 255
)

// KeySource says where the middleware reads the key.
type KeySource int

const (
	// FromHeader reads the Idempotency-Key header (JSON API).
	FromHeader KeySource = iota
	// FromFormField reads the idempotency_key form field (browser forms).
	FromFormField
)

// Config configures Middleware. Scope is required; the rest has defaults.
type Config struct {
	// KeyFrom is where the key comes from. Default FromHeader.
	KeyFrom KeySource
	// Scope returns the signed-in user, whose keys these are. Authentication
	// runs before this middleware; ok = false is answered 401.
	Scope func(c echo.Context) (userID int64, ok bool)
	// HTML, when set, answers every refusal (missing or malformed key, 409,
	// 422, …) instead of returning it as an error, so a browser sees a clear
	// page rather than problem+json. The middleware has already set
	// Retry-After for ErrInProgress.
	HTML func(c echo.Context, refusal *Refusal) error
	// WaitInFlight is how long a duplicate waits for the in-flight original to
	// complete, polling, before it is answered 409. 0 (the default, right for
	// the API) answers 409 at once; forms may wait a moment so a double-click
	// lands on the original's redirect.
	WaitInFlight time.Duration
	// RetryAfter is the Retry-After sent with 409. Default 1s: an in-flight
	// request normally finishes within milliseconds; the lease bounds a crash,
	// it is not the expected wait.
	RetryAfter time.Duration
	// MaxBodyBytes bounds the body read for the fingerprint. Default 1 MiB.
	MaxBodyBytes int64
	// IgnoreFormFields are form fields left out of the fingerprint besides
	// the key itself. Default "_csrf" and "csrf_token" (a fresh CSRF token per
	// render must not make a double-click look like a different request).
	IgnoreFormFields []string
	// Logger receives bookkeeping failures the client cannot be told about.
	// Default slog.Default().
	Logger *slog.Logger
}

func (cfg Config) withDefaults() Config {
	if cfg.Scope == nil {
		panic("idempotency: Config.Scope is required")
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.IgnoreFormFields == nil {
		cfg.IgnoreFormFields = []string{"_csrf", "csrf_token"}
	}
	cfg.IgnoreFormFields = append([]string{FormField}, cfg.IgnoreFormFields...)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Middleware makes the routes it wraps idempotent per the IETF
// Idempotency-Key draft. It claims nothing itself: the claim is made inside
// the workflow's first transaction (see Attempt), so work that stays in
// PostgreSQL commits claim, business writes and answer once, and a crash
// before that commit leaves nothing behind. For each request it validates
// the key, fingerprints the request and reads the key's row:
//
//   - no row, or an IN_PROGRESS row whose owner looks dead (lease expired):
//     the handler runs with an *Attempt in its context (AttemptFrom); its
//     workflow claims the key in its first transaction and stores the answer
//     with Complete in the transaction that decides it;
//   - a COMPLETED row: replay the stored status, headers and body, plus
//     Idempotent-Replayed: true — no write at all;
//   - refuse with a *Refusal: ErrKeyMissing, ErrKeyMalformed, ErrInProgress
//     (with Retry-After), ErrFingerprintMismatch, ErrBodyTooLarge,
//     ErrBodyUnreadable, ErrNotSignedIn — the app's error table answers each
//     (400 idempotency-key-missing, 409 request-in-progress, …).
//
// After the handler returns an error:
//
//   - the key was not the attempt's to take (ErrAlreadyClaimed: a duplicate
//     got there first; ErrInProgress: its transaction outlasted the claim's
//     wait) or was taken from it (ErrLeaseLost: another request took it over
//     while this one was paused): the attempt answers nothing of its own. It
//     answers what the key holds now — the stored answer, replayed — or 409
//     request-in-progress, which is never stored;
//   - any other error (validation before the workflow, a failed or
//     rolled-back transaction): it goes on to the error handler. Nothing is
//     stored; if the attempt's claim had committed (work with an external
//     call), its lease is ended so a retry may take over at once;
//   - a panic or the process dying: a committed claim stays IN_PROGRESS
//     until its lease expires, then a retry takes it over — the crash path,
//     on purpose.
//
// Install it after routing and authentication (route or group middleware).
func Middleware(store *Store, cfg Config) echo.MiddlewareFunc {
	cfg = cfg.withDefaults()
	m := &middleware{store: store, cfg: cfg}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { return m.serve(c, next) }
	}
}

type middleware struct {
	store *Store
	cfg   Config
}

func (m *middleware) serve(c echo.Context, next echo.HandlerFunc) error {
	userID, ok := m.cfg.Scope(c)
	if !ok {
		return m.refuse(c, &Refusal{ErrNotSignedIn, "Sign in before sending a request with an idempotency key."})
	}
	body, p := readBody(c, m.cfg.MaxBodyBytes)
	if p != nil {
		return m.refuse(c, p)
	}
	key, p := m.key(c.Request(), body)
	if p != nil {
		return m.refuse(c, p)
	}
	attempt := &Attempt{
		UserID: userID,
		Key:    key,
		fingerprint: Fingerprint(Request{
			Method:       c.Request().Method,
			Route:        c.Path(),
			Params:       paramPairs(c),
			Query:        c.Request().URL.RawQuery,
			ContentType:  c.Request().Header.Get(echo.HeaderContentType),
			Body:         body,
			IgnoreFields: m.cfg.IgnoreFormFields,
		}),
		store: m.store,
	}

	// The read that decides whether to execute at all. It takes no lock:
	// whatever it lets through ends in the workflow's claim, which checks
	// again under the unique index.
	rec, err := m.store.Lookup(c.Request().Context(), userID, key)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return err
	case rec.Status == StatusInProgress && rec.LeaseExpired && bytes.Equal(rec.Fingerprint, attempt.fingerprint):
		// The owner looks dead: this retry may take over (in the claim).
	default:
		return m.answer(c, attempt, rec)
	}
	return m.execute(c, next, attempt)
}

func (m *middleware) execute(c echo.Context, next echo.HandlerFunc, attempt *Attempt) error {
	c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), attemptKey{}, attempt)))
	err := next(c)
	if err == nil {
		return nil
	}
	// Bookkeeping must happen even if the client has gone away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), 5*time.Second)
	defer cancel()
	// Whatever went wrong, a claim of ours that committed (work with an
	// external call) gives its lease up now, so a retry can take over at once
	// instead of waiting for the lease to run out. Fenced: it changes nothing
	// when the claim never committed or someone else owns the key.
	if err := m.store.EndLease(ctx, attempt.claim); err != nil && !errors.Is(err, ErrLeaseLost) {
		// The key stays IN_PROGRESS until its lease expires: a retry then takes over.
		m.cfg.Logger.Warn("idempotency: could not end the lease of a failed request", "key", attempt.Key, "err", err)
	}
	if errors.Is(err, ErrAlreadyClaimed) || errors.Is(err, ErrInProgress) || errors.Is(err, ErrLeaseLost) {
		// Someone else executes (or executed) this request, or will once it
		// retries: answer what the key holds, never an answer of our own.
		return m.answerFromStore(c, ctx, attempt)
	}
	return err
}

// answerFromStore reads the key again and answers what it holds; forms wait
// up to WaitInFlight for an original still in flight.
func (m *middleware) answerFromStore(c echo.Context, ctx context.Context, attempt *Attempt) error {
	c.Set(waitedKey, true)
	deadline := time.Now().Add(m.cfg.WaitInFlight)
	for {
		rec, err := m.store.Lookup(ctx, attempt.UserID, attempt.Key)
		switch {
		case errors.Is(err, ErrNotFound):
			// The original's transaction is still open (we gave up waiting
			// on it) or rolled back: either way, not ours to answer.
			rec = &Record{Status: StatusInProgress, Fingerprint: attempt.fingerprint}
		case err != nil:
			return err
		}
		if rec.Status == StatusCompleted || time.Now().After(deadline) {
			return m.answer(c, attempt, rec)
		}
		select {
		case <-ctx.Done():
			return m.answer(c, attempt, rec)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// answer answers from a key's row without executing: a replay, 422 for
// another request's key, or 409 while it is in flight (after waiting up to
// WaitInFlight for the original, when configured).
func (m *middleware) answer(c echo.Context, attempt *Attempt, rec *Record) error {
	switch {
	case !bytes.Equal(rec.Fingerprint, attempt.fingerprint):
		return m.refuse(c, &Refusal{ErrFingerprintMismatch,
			"This idempotency key was already used for a different request (method, path or body). Use a new key for a new request."})
	case rec.Status == StatusCompleted:
		return replay(c, rec.Response)
	case m.cfg.WaitInFlight > 0 && c.Get(waitedKey) == nil:
		return m.answerFromStore(c, c.Request().Context(), attempt)
	}
	c.Response().Header().Set("Retry-After", strconv.Itoa(int((m.cfg.RetryAfter+time.Second-1)/time.Second)))
	return m.refuse(c, &Refusal{ErrInProgress,
		"A request with this idempotency key holds its lease: it is running, or it stopped without finishing and holds the key until the lease runs out. Retry after the time in Retry-After: a retry gets its response, or, once the lease is over, takes the key over."})
}

// waitedKey marks a request that already waited WaitInFlight for its original.
const waitedKey = "idempotency.waited"

func (m *middleware) refuse(c echo.Context, r *Refusal) error {
	if m.cfg.HTML != nil {
		return m.cfg.HTML(c, r)
	}
	return r
}

// replay sends a stored response again, byte for byte.
func replay(c echo.Context, resp Response) error {
	c.Response().Header().Set(ReplayedHeader, "true")
	return resp.Write(c)
}

// Write sends r: its headers, status and body. A handler writes the Response
// it completed with this, so the first answer and every replay are the same.
func (r Response) Write(c echo.Context) error {
	h := c.Response().Header()
	for name, values := range r.Header {
		h[name] = values
	}
	c.Response().WriteHeader(r.status())
	_, err := c.Response().Write(r.Body)
	return err
}

// ValidateKey checks the protocol's key rule: 1 to 255 visible ASCII
// characters (0x21–0x7E). UUIDs and ULIDs fit; spaces, control characters and
// non-ASCII do not, so keys survive logs and copy-paste unchanged. The error
// says which rule failed, in words fit for a problem's detail.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return errors.New("the idempotency key is empty")
	case len(key) > MaxKeyLength:
		return fmt.Errorf("the idempotency key is %d characters long; at most %d are allowed", len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if b := key[i]; b < 0x21 || b > 0x7E {
			return fmt.Errorf("the idempotency key has a byte 0x%02X at position %d; only visible ASCII characters (0x21-0x7E) are allowed", b, i)
		}
	}
	return nil
}

// ParseKeyHeader reads an Idempotency-Key header value. The draft defines it
// as a Structured Field string ("…" with \" and \\ escapes); most clients send
// the bare token. Both are accepted and mean the same key.
func ParseKeyHeader(value string) (string, error) {
	key := value
	if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
		var b strings.Builder
		inner := value[1 : len(value)-1]
		for i := 0; i < len(inner); i++ {
			ch := inner[i]
			if ch == '\\' {
				if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", errors.New("the idempotency key is a quoted string with an invalid escape")
				}
				i++
				ch = inner[i]
			} else if ch == '"' {
				return "", errors.New("the idempotency key is a quoted string with an unescaped quote")
			}
			b.WriteByte(ch)
		}
		key = b.String()
	}
	return key, ValidateKey(key)
}

func (m *middleware) key(r *http.Request, body []byte) (string, *Refusal) {
	var (
		raw     []string
		where   string
		present bool
	)
	if m.cfg.KeyFrom == FromFormField {
		where = "the " + FormField + " form field"
		form, err := url.ParseQuery(string(body))
		if err == nil {
			raw, present = form[FormField]
		}
	} else {
		where = "the " + HeaderName + " header"
		raw, present = r.Header[http.CanonicalHeaderKey(HeaderName)]
	}
	if !present {
		return "", &Refusal{ErrKeyMissing, "This request changes state, so it needs an idempotency key in " + where + ": a unique value (such as a UUID) per intended operation, repeated unchanged on every retry."}
	}
	malformed := func(detail string) *Refusal {
		return &Refusal{ErrKeyMalformed, "Bad idempotency key in " + where + ": " + detail + "."}
	}
	if len(raw) != 1 {
		return "", malformed("it was sent more than once")
	}
	var (
		key string
		err error
	)
	if m.cfg.KeyFrom == FromFormField {
		key, err = raw[0], ValidateKey(raw[0])
	} else {
		key, err = ParseKeyHeader(raw[0])
	}
	if err != nil {
		return "", malformed(err.Error())
	}
	return key, nil
}

// readBody reads the whole body (at most limit bytes) and puts it back so the
// handler can read it again.
func readBody(c echo.Context, limit int64) ([]byte, *Refusal) {
	r := c.Request()
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	r.Body.Close()
	if err != nil {
		return nil, &Refusal{ErrBodyUnreadable, err.Error()}
	}
	if int64(len(body)) > limit {
		return nil, &Refusal{ErrBodyTooLarge, fmt.Sprintf("The request body is over %d bytes.", limit)}
	}
	if len(body) == 0 && len(r.PostForm) > 0 {
		// A middleware before us parsed the form (CSRF protection reads its
		// _csrf field), which drains the body. The fields are in PostForm;
		// encoded again they are the same request, because a form's
		// fingerprint is canonical (fields sorted by name).
		body = []byte(r.PostForm.Encode())
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

func paramPairs(c echo.Context) []string {
	names, values := c.ParamNames(), c.ParamValues()
	pairs := make([]string, 0, 2*len(names))
	for i, name := range names {
		if i < len(values) {
			pairs = append(pairs, name, values[i])
		}
	}
	return pairs
}
