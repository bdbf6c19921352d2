package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/fault"
)

// Untrusted input is checked here, before it reaches a store: a JSON body
// against the struct it fills, and every free-text field against the rules
// PostgreSQL's text type and a person reading it later both need. A refusal
// names the field and says what is wrong in the API's own words — never in
// Go's (no type names, no decoder internals).

// decodeOptionalJSON decodes a JSON body into v; an empty body leaves v as
// it is. The body must be application/json, valid UTF-8 (encoding/json
// would silently turn invalid bytes into U+FFFD) and exactly one object of
// v's fields: unknown fields and trailing data are errors, so a typo in a
// field name is not silently ignored.
func decodeOptionalJSON(c echo.Context, v any) error {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	return decodeBody(c, body, v)
}

// decodeJSON is decodeOptionalJSON for a body that must be there.
func decodeJSON(c echo.Context, v any) error {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return invalidJSON("the body is empty; this request takes a JSON object with the fields " + fieldList(v))
	}
	return decodeBody(c, body, v)
}

func decodeBody(c echo.Context, body []byte, v any) error {
	ct := c.Request().Header.Get(echo.HeaderContentType)
	if mt, _, _ := mime.ParseMediaType(ct); mt != echo.MIMEApplicationJSON {
		return refuse(errUnsupportedMediaType, "Unsupported media type",
			"send the body as application/json")
	}
	if !utf8.Valid(body) {
		return invalidJSON("the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var invalid *fault.InvalidError // a fault's own decoder names a number out of range
		if errors.As(err, &invalid) {
			return invalidFault(invalid)
		}
		return jsonProblem(err, v)
	}
	if dec.More() {
		return invalidJSON("the body has data after the JSON value")
	}
	return nil
}

func invalidJSON(detail string) *refusal {
	return refuse(errInvalidJSON, "Invalid JSON", detail)
}

// jsonProblem says what encoding/json found wrong, in terms of the JSON the
// client sent: the field's JSON name and the kind of value it takes.
func jsonProblem(err error, v any) *refusal {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return invalidJSON(fmt.Sprintf("the body is not valid JSON (at byte %d)", syntax.Offset))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidJSON("the body ends in the middle of a JSON value")
	case errors.As(err, &typ) && typ.Field == "":
		return invalidJSON("the body must be a JSON object with the fields " + fieldList(v))
	case errors.As(err, &typ):
		return invalidJSON(fmt.Sprintf("%s must be %s, not %s", typ.Field, jsonKind(typ.Type), typ.Value)).With("field", typ.Field)
	}
	// DisallowUnknownFields has no error type; its text is `json: unknown field "x"`.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return invalidJSON(fmt.Sprintf("%q is not a field of this request; the fields are %s", name, fieldList(v))).With("field", name)
	}
	if strings.Contains(err.Error(), "max depth") {
		return invalidJSON("the body is nested too deeply")
	}
	var tp *time.ParseError
	if errors.As(err, &tp) {
		return invalidJSON("a time must be an RFC 3339 string such as 2026-01-02T15:04:05Z")
	}
	return invalidJSON("the body is not valid JSON for this request")
}

// jsonKind names a Go type as the JSON a client should send for it.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct:
		if t.String() == "time.Time" {
			return "an RFC 3339 time string"
		}
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "a different kind of value"
}

// fieldList names the JSON fields of the struct v points to: "reason" or
// "users, policies_per_user, slots".
func fieldList(v any) string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return "of this request"
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return "(none: send {} or no body)"
	}
	return strings.Join(names, ", ")
}

// maxTextLength bounds the free text a person types: a cancellation's
// reason, a reconciliation note.
const maxTextLength = 500

// validText checks one free-text field before it is stored: valid UTF-8, at
// most max bytes, and no control characters but tab and newlines
// (PostgreSQL's text refuses NUL outright; the others hide in logs and
// pages). The refusal is 422 validation-failed naming the field.
func validText(field, value string, max int) error {
	detail := ""
	switch {
	case !utf8.ValidString(value):
		detail = field + " must be valid UTF-8 text"
	case len(value) > max:
		detail = fmt.Sprintf("%s must be at most %d bytes (it has %d)", field, max, len(value))
	case strings.IndexFunc(value, isControl) >= 0:
		detail = field + " must not contain control characters such as NUL (tab and newlines are fine)"
	default:
		return nil
	}
	return refuse(errValidation, "Invalid "+field, detail).With("field", field)
}

func isControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0)
}
