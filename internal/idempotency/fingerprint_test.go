package idempotency_test

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/idempotency"
)

var ignored = []string{idempotency.FormField, "_csrf"}

func TestFingerprintIdentity(t *testing.T) {
	base := idempotency.Request{
		Method: "POST", Route: "/api/v1/policies/:id/cancel", Params: []string{"id", "7"},
		ContentType: "application/json", Body: []byte(`{"reason":"moving","refund":true}`),
	}
	with := func(change func(r *idempotency.Request)) idempotency.Request {
		r := base
		change(&r)
		return r
	}
	same := map[string]idempotency.Request{
		"keys reordered, whitespace": with(func(r *idempotency.Request) { r.Body = []byte("{ \"refund\" : true,\n\t\"reason\":\"moving\" }") }),
		"charset parameter":          with(func(r *idempotency.Request) { r.ContentType = "application/json; charset=utf-8" }),
		"+json media type":           with(func(r *idempotency.Request) { r.ContentType = "application/problem+json" }),
	}
	different := map[string]idempotency.Request{
		"other value":       with(func(r *idempotency.Request) { r.Body = []byte(`{"reason":"moving","refund":false}`) }),
		"number spelling":   with(func(r *idempotency.Request) { r.Body = []byte(`{"reason":"moving","refund":true,"n":1}`) }),
		"other path value":  with(func(r *idempotency.Request) { r.Params = []string{"id", "8"} }),
		"other route":       with(func(r *idempotency.Request) { r.Route = "/api/v1/policies/:id/renew" }),
		"other method":      with(func(r *idempotency.Request) { r.Method = "PUT" }),
		"query":             with(func(r *idempotency.Request) { r.Query = "dry_run=1" }),
		"same bytes as raw": with(func(r *idempotency.Request) { r.ContentType = "text/plain" }),
	}
	want := idempotency.Fingerprint(base)
	if len(want) != 32 {
		t.Fatalf("fingerprint is %d bytes, want 32 (SHA-256)", len(want))
	}
	for name, r := range same {
		if !bytes.Equal(idempotency.Fingerprint(r), want) {
			t.Errorf("%s: fingerprint differs, want the same", name)
		}
	}
	for name, r := range different {
		if bytes.Equal(idempotency.Fingerprint(r), want) {
			t.Errorf("%s: fingerprint equal, want different", name)
		}
	}

	one := idempotency.Fingerprint(idempotency.Request{Body: []byte(`{"n":1}`), ContentType: "application/json"})
	onePointZero := idempotency.Fingerprint(idempotency.Request{Body: []byte(`{"n":1.0}`), ContentType: "application/json"})
	if bytes.Equal(one, onePointZero) {
		t.Error("1 and 1.0 fingerprint alike; numbers must be kept as written")
	}

	form := func(body string) []byte {
		return idempotency.Fingerprint(idempotency.Request{
			Method: "POST", Route: "/policies/:id/cancel", ContentType: "application/x-www-form-urlencoded",
			Body: []byte(body), IgnoreFields: ignored,
		})
	}
	if !bytes.Equal(form("reason=moving&idempotency_key=a&_csrf=x&refund=on"), form("refund=on&_csrf=y&reason=moving&idempotency_key=b")) {
		t.Error("form fields reordered, key and CSRF token changed: fingerprint differs, want the same")
	}
	if bytes.Equal(form("tag=a&tag=b"), form("tag=b&tag=a")) {
		t.Error("repeated values reordered: fingerprint equal, want different (their order may matter)")
	}
}

// FuzzFingerprint checks the canonical JSON and form forms: canonicalising is
// a fixed point, and whitespace, key order, the key field and the CSRF field
// never change the result.
func FuzzFingerprint(f *testing.F) {
	for _, seed := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":"x"}]}`,
		`  [ 1.0, 1e3, -0, 12345678901234567890 ] `,
		`"<&>\u2028"`,
		`{}`, `[]`, `null`, ``,
		`{"a":1,"a":2}`,
		`{"a":1}{"b":2}`,
		`not json`,
		`note=hi&idempotency_key=k&_csrf=t`,
		`a=1&a=2&b=%ZZ`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const jsonType = "application/json"
		kind, canonical := idempotency.CanonicalBody(jsonType, body)
		if json.Valid(body) {
			if kind != "json" {
				t.Fatalf("valid JSON %q canonicalised as %s", body, kind)
			}
			if _, again := idempotency.CanonicalBody(jsonType, canonical); !bytes.Equal(again, canonical) {
				t.Fatalf("not a fixed point: %q → %q → %q", body, canonical, again)
			}
			var indented bytes.Buffer
			if err := json.Indent(&indented, body, "", "\t"); err != nil {
				t.Fatal(err)
			}
			if _, c := idempotency.CanonicalBody(jsonType, indented.Bytes()); !bytes.Equal(c, canonical) {
				t.Fatalf("whitespace changed the canonical form: %q vs %q", c, canonical)
			}
			if _, c := idempotency.CanonicalBody(jsonType, reverseKeys(t, body)); !bytes.Equal(c, canonical) {
				t.Fatalf("key order changed the canonical form: %q vs %q", c, canonical)
			}
		}

		values, err := url.ParseQuery(string(body))
		if err != nil {
			return
		}
		_, want := idempotency.CanonicalBody("application/x-www-form-urlencoded", body, ignored...)
		values.Set(idempotency.FormField, "another-key")
		values.Set("_csrf", "another-token")
		shuffled := reverseForm(values)
		if _, got := idempotency.CanonicalBody("application/x-www-form-urlencoded", shuffled, ignored...); !bytes.Equal(got, want) {
			t.Fatalf("form %q: reordering and changing the ignored fields changed the canonical form: %q vs %q", body, got, want)
		}
	})
}

// reverseKeys re-encodes valid JSON with every object's keys in reverse order.
func reverseKeys(t *testing.T, body []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var write func(v any)
	write = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Sort(sort.Reverse(sort.StringSlice(keys)))
			buf.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					buf.WriteByte(',')
				}
				kb, _ := json.Marshal(k)
				buf.Write(kb)
				buf.WriteByte(':')
				write(v[k])
			}
			buf.WriteByte('}')
		case []any:
			buf.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					buf.WriteByte(',')
				}
				write(e)
			}
			buf.WriteByte(']')
		default:
			b, _ := json.Marshal(v)
			buf.Write(b)
		}
	}
	write(v)
	return buf.Bytes()
}

// reverseForm encodes values with the field names in reverse order.
func reverseForm(values url.Values) []byte {
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	slices.Sort(names)
	slices.Reverse(names)
	var parts []string
	for _, name := range names {
		for _, v := range values[name] {
			parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(v))
		}
	}
	return []byte(strings.Join(parts, "&"))
}

// The key rule, stated once more as the database's CHECK constraint states it.
var keyRule = regexp.MustCompile(`^[!-~]{1,255}$`)

func FuzzValidateKey(f *testing.F) {
	for _, seed := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324", "01HZX3", "", " ", "a b", "clé", "\x00", "\x7f",
		strings.Repeat("k", 255), strings.Repeat("k", 256), `"quoted"`, `"esc\"aped\\"`, `"bad\q"`, `"`, `""`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := idempotency.ValidateKey(key)
		if (err == nil) != keyRule.MatchString(key) {
			t.Fatalf("ValidateKey(%q) = %v; the rule says valid = %v", key, err, keyRule.MatchString(key))
		}

		parsed, err := idempotency.ParseKeyHeader(key)
		if err == nil && !keyRule.MatchString(parsed) {
			t.Fatalf("ParseKeyHeader(%q) accepted %q, which breaks the rule", key, parsed)
		}
		if keyRule.MatchString(key) && !strings.HasPrefix(key, `"`) && parsed != key {
			t.Fatalf("ParseKeyHeader(%q) = %q, want the bare key unchanged", key, parsed)
		}
		// Quoting a valid key as a Structured Field string names the same key.
		if keyRule.MatchString(key) {
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
			if got, err := idempotency.ParseKeyHeader(quoted); err != nil || got != key {
				t.Fatalf("ParseKeyHeader(%q) = %q, %v; want %q", quoted, got, err, key)
			}
		}
	})
}
