package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/provider/fake"
)

// One rule for every answer a customer gets (issue 29, finding 26): no
// owner token (the fence), no error text recorded for operators, no raw
// step answer — in a policy cancellation's answer, a deposit booking's and
// its cancellation's, their replays and the bytes stored with their keys,
// the operation read back, the lists and the pages. An admin still reads
// the texts as recorded.
func TestEveryCustomerAnswerIsRedacted(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "2s", "PAYMENTS_TIMEOUT": "2s", "RECOVERY_INTERVAL": "1h"})
	setPayments := func(body string) {
		t.Helper()
		if r := s.do(request{Method: "PUT", Path: "/api/v1/payments/faults", Token: "demo-admin", Body: body}); r.Status != http.StatusOK {
			t.Fatalf("payments faults %s: %d %s", body, r.Status, r.Body)
		}
	}
	type answer struct {
		what string
		r    response
	}
	var answers []answer
	keyed := func(what string, send func(key string) response, want int) response {
		t.Helper()
		key := newKey()
		first := send(key)
		if first.Status != want {
			t.Fatalf("%s: %d %s, want %d", what, first.Status, first.Body, want)
		}
		again := send(key)
		assertReplay(t, first, again)
		answers = append(answers, answer{what, first}, answer{what + " (replayed)", again})
		return first
	}
	opOf := func(r response) int64 {
		var v struct {
			ID          int64 `json:"id"`
			OperationID int64 `json:"operation_id"`
			Operation   *struct {
				ID int64 `json:"id"`
			} `json:"operation"`
		}
		json.Unmarshal(r.Body, &v)
		switch {
		case v.Operation != nil:
			return v.Operation.ID
		case v.OperationID != 0:
			return v.OperationID
		}
		return v.ID
	}
	var ops []int64

	// A policy cancellation whose provider answers 503: 202, its outcome unknown.
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeError })
	pid := s.policyOf(t, "demo-alice", 0)
	r := keyed("a policy cancellation (provider error)", func(k string) response { return s.do(cancelReq(pid, "demo-alice", k, "")) }, http.StatusAccepted)
	ops = append(ops, opOf(r))

	// A deposit booking whose charge answers 503: 202, PENDING.
	setPayments(`{"mode":"error"}`)
	slot := depositSlot(t, s.DB, 0)
	r = keyed("a deposit booking (payments error)", func(k string) response { return s.book("demo-alice", slot, k, "") }, http.StatusAccepted)
	ops = append(ops, opOf(r))

	// A declined deposit: 402 with the reason.
	setPayments(`{"mode":"reject"}`)
	slot = depositSlot(t, s.DB, 1)
	r = keyed("a declined deposit", func(k string) response { return s.book("demo-alice", slot, k, "") }, http.StatusPaymentRequired)
	ops = append(ops, opOf(r))

	// Two paid deposit bookings, cancelled: the refund answers 503 (202),
	// then is refused (409 refund-refused).
	setPayments(`{"mode":"ok"}`)
	var bookings []int64
	for i := range 2 {
		var b struct {
			ID int64 `json:"id"`
		}
		r := s.book("demo-alice", depositSlot(t, s.DB, 1+i), newKey(), "")
		r.JSON(t, &b)
		if r.Status != http.StatusCreated {
			t.Fatalf("a paid deposit: %d %s", r.Status, r.Body)
		}
		bookings = append(bookings, b.ID)
	}
	setPayments(`{"mode":"error"}`)
	r = keyed("a deposit cancellation (payments error)", func(k string) response { return s.release("demo-alice", bookings[0], k) }, http.StatusAccepted)
	ops = append(ops, opOf(r))
	setPayments(`{"mode":"reject"}`)
	r = keyed("a refused refund", func(k string) response { return s.release("demo-alice", bookings[1], k) }, http.StatusConflict)
	ops = append(ops, opOf(r))

	// The answers that went well, and the refusals of a second intent, carry
	// the operation too: a second cancellation of the first policy under a
	// new key (409 duplicate-intent), a cancellation the provider confirmed
	// (200), a paid deposit booking (201) and its cancellation refunded (200).
	keyed("a second cancellation of the same policy (new key)", func(k string) response { return s.do(cancelReq(pid, "demo-alice", k, "")) },
		http.StatusConflict)
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeOK })
	setPayments(`{"mode":"ok"}`)
	r = keyed("a policy cancellation (confirmed)", func(k string) response {
		return s.do(cancelReq(s.policyOf(t, "demo-alice", 1), "demo-alice", k, ""))
	}, http.StatusOK)
	ops = append(ops, opOf(r))
	slot = depositSlot(t, s.DB, 0)
	r = keyed("a paid deposit booking", func(k string) response { return s.book("demo-alice", slot, k, "") }, http.StatusCreated)
	ops = append(ops, opOf(r))
	var paid struct {
		ID int64 `json:"id"`
	}
	r.JSON(t, &paid)
	bookings = append(bookings, paid.ID)
	r = keyed("a refunded deposit cancellation", func(k string) response { return s.release("demo-alice", paid.ID, k) }, http.StatusOK)
	ops = append(ops, opOf(r))

	// Bob's cancellation, live too (the provider still answers 503): alice
	// sees recovery at work on it, not bob's reason or request key.
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeError })
	bobKey := "bob-private-key-" + newKey()
	if r := s.do(cancelReq(s.policyOf(t, "demo-bob", 0), "demo-bob", bobKey, `{"reason":"bob-private-reason"}`)); r.Status != http.StatusAccepted {
		t.Fatalf("bob's cancellation: %d %s", r.Status, r.Body)
	}

	// Everything the customer reads back.
	client := s.browserClient()
	s.signIn(t, client, "alice")
	get := func(path string) {
		t.Helper()
		var r response
		if strings.HasPrefix(path, "/api/") {
			r = s.do(request{Method: "GET", Path: path, Token: "demo-alice"})
		} else {
			r = doWith(t, client, s.URL, request{Method: "GET", Path: path})
		}
		if r.Status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
		}
		answers = append(answers, answer{"GET " + path, r})
	}
	for _, id := range ops {
		if id == 0 {
			t.Fatalf("an answer named no operation: %v", ops)
		}
		get(fmt.Sprintf("/api/v1/operations/%d", id))
		get(fmt.Sprintf("/operations/%d", id))
	}
	for _, id := range bookings {
		get(fmt.Sprintf("/api/v1/bookings/%d", id))
		get(fmt.Sprintf("/bookings/%d", id))
	}
	for _, p := range []string{"/api/v1/operations", "/api/v1/bookings", "/api/v1/recovery", "/operations", "/recovery"} {
		get(p)
	}

	// What must not reach a customer, read from the database: every owner
	// token, every error text a step or a status query kept, and the
	// last_error that quotes one. (A definite refusal's reason is the other
	// system's answer about the customer's own request, and stays theirs to
	// read, in the step's answer and on the timeline.)
	ctx := context.Background()
	var secrets []string
	rows, err := s.DB.Pool.Query(ctx, `
		SELECT owner_token::text FROM operations WHERE owner_token IS NOT NULL
		UNION SELECT owner_token::text FROM operation_events WHERE owner_token IS NOT NULL
		UNION SELECT owner_token::text FROM operation_calls WHERE owner_token IS NOT NULL
		UNION SELECT answer->>'error' FROM operation_steps WHERE answer->>'error' IS NOT NULL
		UNION SELECT detail FROM operation_calls WHERE kind = 'status' AND truth IS NULL AND detail <> ''
		UNION SELECT o.last_error
		        FROM operations o
		       WHERE o.last_error IS NOT NULL
		         AND EXISTS (SELECT 1 FROM operation_steps s WHERE s.operation_id = o.id AND s.answer ? 'error')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, v)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	var rawErrors int
	for _, v := range secrets {
		if strings.Contains(v, "503") {
			rawErrors++
		}
	}
	if rawErrors == 0 {
		t.Fatalf("no raw error was recorded, so this test proves nothing: %q", secrets)
	}

	// The bytes stored with the customer's keys are what replays send.
	stored, err := s.DB.Pool.Query(ctx, `
		SELECT k.idempotency_key, k.response_body
		  FROM idempotency_keys k
		  JOIN users u ON u.id = k.user_id
		 WHERE u.name = 'alice'
		   AND k.response_body IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for stored.Next() {
		var key string
		var body []byte
		if err := stored.Scan(&key, &body); err != nil {
			t.Fatal(err)
		}
		answers = append(answers, answer{"the answer stored with key " + key, response{Status: 200, Body: body}})
	}

	secrets = append(secrets, bobKey, "bob-private-reason") // another customer's
	for _, a := range answers {
		body := string(a.r.Body)
		for _, secret := range secrets {
			for _, form := range forms(secret) {
				if strings.Contains(body, form) {
					t.Errorf("%s carries %q:\n%s", a.what, secret, body)
				}
			}
		}
		var v any
		if json.Unmarshal(a.r.Body, &v) == nil {
			walkOwnerTokens(t, a.what, v)
		}
		assertNoInternals(t, a.what, body)
	}

	// An admin reads the texts as recorded.
	admin := s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", ops[1]), Token: "demo-admin"})
	var full struct {
		LastError  *string `json:"last_error"`
		OwnerToken *string `json:"owner_token"`
	}
	admin.JSON(t, &full)
	if full.LastError == nil || !strings.Contains(*full.LastError, "503") || full.OwnerToken == nil {
		t.Errorf("the admin's view of the deposit booking: %s", admin.Body)
	}
}

// forms are the ways a text can appear in an answer: as it is, escaped in
// JSON, escaped in HTML.
func forms(s string) []string {
	j, _ := json.Marshal(s)
	return []string{s, strings.Trim(string(j), `"`), html.EscapeString(s)}
}

// walkOwnerTokens fails the test for every "owner_token" in v that is not null.
func walkOwnerTokens(t *testing.T, what string, v any) {
	t.Helper()
	switch x := v.(type) {
	case map[string]any:
		for k, y := range x {
			if k == "owner_token" && y != nil {
				t.Errorf("%s: owner_token %v", what, y)
			}
			walkOwnerTokens(t, what, y)
		}
	case []any:
		for _, y := range x {
			walkOwnerTokens(t, what, y)
		}
	}
}
