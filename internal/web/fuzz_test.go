package web

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/idempotency"
)

// Fuzz tests of every parser of untrusted input in the HTTP layer. `go
// test` (make test) runs their seeds; `go test -fuzz=FuzzX ./internal/web`
// (make fuzz) explores further. Each states the rule the parser promises
// and checks it holds for whatever comes in.

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"1", "42", "0", "-1", "007", "9223372036854775807", "9223372036854775808", "1e3", " 1", "١", "+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := parseID(s)
		if err != nil {
			return
		}
		if id <= 0 || strings.TrimLeft(s, "0123456789") != "" || len(s) > 19 {
			t.Fatalf("parseID(%q) = %d: accepted something that is not a positive decimal id", s, id)
		}
		if back, _ := strconv.ParseInt(s, 10, 64); back != id {
			t.Fatalf("parseID(%q) = %d, want %d", s, id, back)
		}
	})
}

func FuzzListParams(f *testing.F) {
	cursor := base64.RawURLEncoding.EncodeToString([]byte("41"))
	for _, q := range []string{"", "limit=10", "limit=0", "limit=1001", "limit=99999999999999999999", "cursor=" + cursor,
		"cursor=!!", "cursor=LTE", "limit=5&limit=6", "cursor=%00", "limit=1;drop"} {
		f.Add(q)
	}
	e := echo.New()
	f.Fuzz(func(t *testing.T, query string) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.RawQuery = query
		lp, err := parseListParams(e.NewContext(req, httptest.NewRecorder()))
		if err != nil {
			p, known := toProblem(err)
			if !known || p.Status != http.StatusBadRequest || p.Extra["parameter"] == nil {
				t.Fatalf("%q: %v, want 400 invalid-parameter naming it", query, err)
			}
			return
		}
		if lp.Limit < 1 || lp.Limit > maxLimit || lp.AfterID < 0 {
			t.Fatalf("%q: %+v out of bounds", query, lp)
		}
	})
}

// FuzzDecodeJSON: every body is either decoded or refused with a 400/415
// problem that shows nothing of Go.
func FuzzDecodeJSON(f *testing.F) {
	for _, b := range []string{``, `{}`, `{"reason":"x"}`, `{"reason":5}`, `{"reason":`, `[1]`, `{"users":"x"}`, `{"zzz":1}`,
		`{"reason":"\u0000"}`, "{\"reason\":\"\xff\"}", `{} {}`, `{"seen_updated_at":"yesterday"}`, `null`, `"x"`,
		`{"users":1e400}`, strings.Repeat("[", 10001)} {
		f.Add([]byte(b), "application/json")
	}
	f.Add([]byte(`{}`), "text/plain")
	e := echo.New()
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		for _, target := range []any{&cancelBody{}, &resolveBody{}, &demo.Dataset{}} {
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
			req.Header.Set(echo.HeaderContentType, contentType)
			err := decodeOptionalJSON(e.NewContext(req, httptest.NewRecorder()), target)
			if err == nil {
				if len(bytes.TrimSpace(body)) > 0 && !utf8.Valid(body) {
					t.Fatalf("%q: accepted invalid UTF-8", body)
				}
				continue
			}
			p, known := toProblem(err)
			if !known || (p.Status != http.StatusBadRequest && p.Status != http.StatusUnsupportedMediaType) {
				t.Fatalf("%q into %T: %v, want a 400 or 415 problem", body, target, err)
			}
			for _, w := range []string{"web.", "demo.", "Go ", "json:", "struct"} {
				if strings.Contains(p.Detail, w) {
					t.Fatalf("%q into %T: detail %q shows %q", body, target, p.Detail, w)
				}
			}
		}
	})
}

func FuzzValidText(f *testing.F) {
	for _, s := range []string{"", "moving abroad", "a\x00b", "\xff", "tab\there", "line\nbreak", "\u0085", strings.Repeat("é", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := validText("reason", s, maxTextLength)
		if err != nil {
			p, known := toProblem(err)
			if !known || p.Status != http.StatusUnprocessableEntity || p.Extra["field"] != "reason" {
				t.Fatalf("%q: %v, want 422 naming the field", s, err)
			}
			return
		}
		if !utf8.ValidString(s) || len(s) > maxTextLength || strings.ContainsAny(s, "\x00\x01\x1b\x7f") {
			t.Fatalf("%q: accepted", s)
		}
	})
}

func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "abc-123", "a b", "\xff", strings.Repeat("x", 129), "id\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !validRequestID(s) {
			return
		}
		if len(s) == 0 || len(s) > maxRequestIDLength {
			t.Fatalf("%q: accepted, wrong length", s)
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 0x21 || s[i] > 0x7E {
				t.Fatalf("%q: accepted byte 0x%02x", s, s[i])
			}
		}
	})
}

func FuzzIdempotencyKeyHeader(f *testing.F) {
	for _, s := range []string{"k1", `"k1"`, `"a\"b"`, `"a\b"`, `"`, `""`, "ключ", strings.Repeat("k", 256), "a b", "a\tb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idempotency.ParseKeyHeader(v)
		if err != nil {
			return
		}
		if idempotency.ValidateKey(key) != nil {
			t.Fatalf("%q: parsed to %q, which is not a valid key", v, key)
		}
		if !strings.HasPrefix(v, `"`) && key != v {
			t.Fatalf("bare %q parsed to %q", v, key)
		}
	})
}

// FuzzFormFingerprint: a form's identity does not depend on how it was
// encoded — the same fields in another order, or re-encoded after a CSRF
// check parsed them, are the same request — and the CSRF token and the key
// are not part of it.
func FuzzFormFingerprint(f *testing.F) {
	for _, b := range []string{"reason=x&idempotency_key=k", "b=2&a=1", "a=%FF", "a=1&a=2", "=x", "%", "reason=a%00b&_csrf=t"} {
		f.Add(b)
	}
	const ct = "application/x-www-form-urlencoded"
	f.Fuzz(func(t *testing.T, body string) {
		form, err := url.ParseQuery(body)
		if err != nil {
			return
		}
		fp := func(b string) []byte {
			return idempotency.Fingerprint(idempotency.Request{Method: "POST", Route: "/x", ContentType: ct, Body: []byte(b), IgnoreFields: []string{"idempotency_key", "_csrf"}})
		}
		if !bytes.Equal(fp(body), fp(form.Encode())) {
			t.Fatalf("%q and its re-encoding %q fingerprint differently", body, form.Encode())
		}
		form.Set("_csrf", "another-token")
		form.Set("idempotency_key", "another-key")
		if !bytes.Equal(fp(body), fp(form.Encode())) {
			t.Fatalf("%q: the CSRF token or the key changed the fingerprint", body)
		}
	})
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"10/m", "20/s", "300/h", "off", "0", "1/d", "-1/s", "99999999999999999999/s", "/", "5/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			return
		}
		if r.Events == 0 {
			return // off
		}
		if r.Events < 0 || r.Per <= 0 {
			t.Fatalf("%q: %+v", s, r)
		}
		if back, err := ParseRate(r.String()); err != nil || back != r {
			t.Fatalf("%q: %+v does not survive its String %q", s, r, r.String())
		}
	})
}

// FuzzCSRF: a form passes the CSRF check exactly when it carries the token
// bound to its binding (the session id, or the pre-session cookie).
func FuzzCSRF(f *testing.F) {
	app := &App{secret: []byte("fuzz-secret")}
	good := app.csrfTokenFor("pre-session-value")
	f.Add("pre-session-value", good)
	f.Add("pre-session-value", "")
	f.Add("", good)
	f.Add("other", good)
	f.Add("pre-session-value", good+"x")
	e := echo.New()
	f.Fuzz(func(t *testing.T, binding, sent string) {
		if strings.ContainsAny(binding, ";,\" \t\r\n\x00") || !utf8.ValidString(binding) {
			return // not a cookie value a browser can send
		}
		req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(url.Values{csrfField: {sent}}.Encode()))
		req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationForm)
		if binding != "" {
			req.AddCookie(&http.Cookie{Name: csrfCookie, Value: binding})
		}
		passed := false
		_ = app.csrfProtection(func(echo.Context) error { passed = true; return nil })(e.NewContext(req, httptest.NewRecorder()))
		want := binding != "" && sent == app.csrfTokenFor(binding)
		if passed != want {
			t.Fatalf("binding %q, token %q: passed %v, want %v", binding, sent, passed, want)
		}
	})
}
