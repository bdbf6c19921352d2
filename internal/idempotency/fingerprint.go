package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/url"
	"slices"
)

// Request is what identifies a request for fingerprinting. Two requests with
// the same key must agree on all of it, or the second is refused with 422.
type Request struct {
	Method string
	// Route is the route pattern, e.g. "/api/v1/policies/:id/cancel".
	Route string
	// Params are the path parameters as name, value pairs in route order. The
	// pattern alone would make /policies/1/cancel and /policies/2/cancel one
	// request, so the values belong to the identity too.
	Params []string
	// Query is the raw query string; its parameters are compared sorted.
	Query       string
	ContentType string
	Body        []byte
	// IgnoreFields are form fields left out of the identity (the key itself,
	// CSRF tokens) because they change between renders of the same form.
	IgnoreFields []string
}

// Fingerprint returns the SHA-256 of r's canonical form: method, route,
// path parameters, sorted query and canonical body, NUL-separated (none of
// them can hold a NUL except the body, which comes last).
func Fingerprint(r Request) []byte {
	h := sha256.New()
	io.WriteString(h, "idemlab-fingerprint-v1\x00")
	io.WriteString(h, r.Method+"\x00"+r.Route+"\x00")
	for _, p := range r.Params {
		io.WriteString(h, url.QueryEscape(p)+"\x00")
	}
	q, err := url.ParseQuery(r.Query)
	if err != nil {
		io.WriteString(h, "raw-query\x00"+r.Query+"\x00")
	} else {
		io.WriteString(h, "query\x00"+q.Encode()+"\x00")
	}
	kind, body := CanonicalBody(r.ContentType, r.Body, r.IgnoreFields...)
	io.WriteString(h, kind+"\x00")
	h.Write(body)
	return h.Sum(nil)
}

// Body kinds CanonicalBody reports; they are part of the fingerprint so a
// JSON body and a raw body with the same bytes never collide.
const (
	kindJSON = "json"
	kindForm = "form"
	kindRaw  = "raw"
)

// CanonicalBody returns the body in a form where differences the handler
// cannot see are gone:
//
//   - JSON (application/json, any +json): decoded with UseNumber and re-encoded
//     compactly with object keys sorted — key order and whitespace do not
//     matter, number literals are kept exactly;
//   - forms (application/x-www-form-urlencoded): fields sorted by name, the
//     ignore fields left out, repeated values kept in order;
//   - anything else, or a body that does not parse as its type: the bytes as
//     they are (the handler will reject it; the fingerprint only has to be
//     stable).
func CanonicalBody(contentType string, body []byte, ignore ...string) (kind string, canonical []byte) {
	mediaType, _, _ := mime.ParseMediaType(contentType)
	switch {
	case isJSON(mediaType):
		if c, err := canonicalJSON(body); err == nil {
			return kindJSON, c
		}
	case mediaType == "application/x-www-form-urlencoded":
		if c, err := canonicalForm(body, ignore); err == nil {
			return kindForm, c
		}
	}
	return kindRaw, body
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" ||
		(len(mediaType) > 5 && mediaType[len(mediaType)-5:] == "+json")
}

var errTrailingData = errors.New("idempotency: trailing data after JSON value")

func canonicalJSON(body []byte) ([]byte, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return []byte{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	// UseNumber keeps 1.0 and 1e0 as written: the handler may tell them apart.
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errTrailingData
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// encoding/json writes map keys sorted: that is the canonical order.
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func canonicalForm(body []byte, ignore []string) ([]byte, error) {
	values, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, err
	}
	for name := range values {
		if slices.Contains(ignore, name) {
			delete(values, name)
		}
	}
	// Encode sorts by field name.
	return []byte(values.Encode()), nil
}
