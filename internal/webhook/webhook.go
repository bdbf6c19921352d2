// Package webhook is the wire contract of a callback from an external
// system to the app — what the fakes send (internal/fault) and the app
// checks (internal/web) — in the shape of the Standard Webhooks
// specification, which Stripe's and Svix's signatures resemble:
//
//	POST /webhooks/{system}
//	Webhook-Id:        evt_…            the event's id: every copy and retry carries the same
//	Webhook-Timestamp: 1733250000       seconds since the epoch, when this copy was signed
//	Webhook-Signature: v1,<base64>      HMAC-SHA256(secret, id + "." + timestamp + "." + body)
//
//	{"id":"evt_…","key":"41:provider_cancel","status":"COMPLETED","reason":"",
//	 "occurred_at":"…","attempt":2}
//
// The signature proves who sent the callback and that nothing in it was
// changed; the timestamp inside it bounds how long a captured callback can
// be replayed (the tolerance window). Within the window a replay is caught
// by the event id: the receiver applies each id once.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a callback.
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

// Event is the body of a callback: what one call reached.
type Event struct {
	ID string `json:"id"`
	// Key is the idempotency key of the call reported on: the app's step key.
	Key string `json:"key"`
	// Status is RUNNING, COMPLETED or REJECTED.
	Status     string    `json:"status"`
	Reason     string    `json:"reason,omitempty"`
	OccurredAt time.Time `json:"occurred_at"`
	// Attempt counts the deliveries of this copy, 1 for the first.
	Attempt int `json:"attempt"`
}

// Tolerance is how far a callback's timestamp may be from the receiver's
// clock, either way.
const Tolerance = 5 * time.Minute

// Why a callback is refused.
var (
	ErrMissing   = errors.New("webhook: a signature header is missing")
	ErrSignature = errors.New("webhook: the signature does not match")
	ErrStale     = errors.New("webhook: the timestamp is outside the tolerance window")
)

// Sign returns the Webhook-Signature value of body sent as event id at ts.
func Sign(secret []byte, id string, ts time.Time, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(mac(secret, id, strconv.FormatInt(ts.Unix(), 10), body))
}

func mac(secret []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}

// SetHeaders signs body as event id at ts and sets the three headers.
func SetHeaders(h http.Header, secret []byte, id string, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, Sign(secret, id, ts, body))
}

// Verify checks a callback's headers against body at now: ErrMissing,
// ErrSignature (wrong secret, changed id, timestamp or body), or ErrStale
// (signed by the sender, but outside the window: a replay, or a clock far
// off). The signature is checked first, so a forger learns nothing about
// the window. The header may carry several space-separated signatures (a
// secret being rotated); one match is enough. It returns the event id.
func Verify(h http.Header, secret []byte, body []byte, now time.Time, tolerance time.Duration) (string, error) {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return "", ErrMissing
	}
	want := mac(secret, id, ts, body)
	ok := false
	for _, s := range strings.Fields(sigs) {
		v, enc, found := strings.Cut(s, ",")
		if !found || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(enc)
		if err == nil && hmac.Equal(got, want) {
			ok = true
		}
	}
	if !ok {
		return "", ErrSignature
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: %q is not a number of seconds", ErrStale, ts)
	}
	if d := now.Sub(time.Unix(secs, 0)); d > tolerance || d < -tolerance {
		return "", fmt.Errorf("%w: signed %s from now (allowed ±%s)", ErrStale, d.Round(time.Second), tolerance)
	}
	return id, nil
}
