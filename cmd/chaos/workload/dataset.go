package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Customer is one user the clients act as.
type Customer struct {
	Name  string `json:"name"`
	Token string `json:"token"`
}

// Policy is one ACTIVE policy a cancel intent may take (each once).
type Policy struct {
	ID    int64 `json:"id"`
	Owner int   `json:"owner"` // index into Dataset.Customers
}

// Dataset is what the workload acts on, read through the API after a
// reset, before any fault.
type Dataset struct {
	Customers []Customer `json:"customers"`
	Policies  []Policy   `json:"policies"` // shuffled by the seed
	Slots     []int64    `json:"slots"`

	mu   sync.Mutex
	next int
}

// takePolicy hands each policy to one intent only: a policy cancelled
// twice with two keys would be a duplicate intent by design, and the
// checks could not tell it from a lost key.
func (d *Dataset) takePolicy() (Policy, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.next >= len(d.Policies) {
		return Policy{}, false
	}
	d.next++
	return d.Policies[d.next-1], true
}

// Size is the reset's dataset.
type Size struct {
	Users           int `json:"users"`
	PoliciesPerUser int `json:"policies_per_user"`
	Slots           int `json:"slots"`
}

// Load resets the app to a fresh dataset of size (POST /api/v1/admin/reset,
// which needs ALLOW_RESET=true) and reads back the customers, their ACTIVE
// policies and the slots.
func Load(ctx context.Context, inst Instance, adminToken string, size Size, seed uint64) (*Dataset, error) {
	var out struct {
		Users []struct{ Name, Role, Token string } `json:"users"`
	}
	if err := Call(ctx, inst, adminToken, http.MethodPost, "/api/v1/admin/reset", size, &out); err != nil {
		return nil, fmt.Errorf("workload: reset: %w", err)
	}
	d := &Dataset{}
	for _, u := range out.Users {
		if u.Role == "customer" {
			d.Customers = append(d.Customers, Customer{u.Name, u.Token})
		}
	}
	for i, cu := range d.Customers {
		ids, err := listIDs(ctx, inst, cu.Token, "/api/v1/policies?status=ACTIVE")
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			d.Policies = append(d.Policies, Policy{ID: id, Owner: i})
		}
	}
	slots, err := listIDs(ctx, inst, adminToken, "/api/v1/slots?status=AVAILABLE")
	if err != nil {
		return nil, err
	}
	d.Slots = slots
	if len(d.Customers) == 0 || len(d.Slots) == 0 {
		return nil, fmt.Errorf("workload: the dataset has %d customers and %d slots", len(d.Customers), len(d.Slots))
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	rng.Shuffle(len(d.Policies), func(i, j int) { d.Policies[i], d.Policies[j] = d.Policies[j], d.Policies[i] })
	return d, nil
}

// listIDs follows a paginated list to its end.
func listIDs(ctx context.Context, inst Instance, token, path string) ([]int64, error) {
	var ids []int64
	cursor := ""
	for {
		p := path + "&limit=1000"
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		var page struct {
			Items []struct {
				ID int64 `json:"id"`
			} `json:"items"`
			NextCursor *string `json:"next_cursor"`
		}
		if err := Call(ctx, inst, token, http.MethodGet, p, nil, &page); err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			ids = append(ids, it.ID)
		}
		if page.NextCursor == nil {
			return ids, nil
		}
		cursor = *page.NextCursor
	}
}

var callClient = &http.Client{Timeout: 30 * time.Second}

// Call is an unrecorded request outside the workload (setup, the checks'
// reads) that must answer 2xx; out, if not nil, receives its JSON. It
// retries a few times on no answer and on 5xx: the setup and the checks
// run while the system is quiet, but a database restart may still echo.
func Call(ctx context.Context, inst Instance, token, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	var last error
	for try := range 5 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(try) * 500 * time.Millisecond):
			}
		}
		status, raw, err := do(ctx, inst, token, method, path, body)
		switch {
		case err != nil:
			last = err
			continue
		case status >= 500:
			last = fmt.Errorf("%d %s", status, bytes.TrimSpace(raw))
			continue
		case status/100 != 2:
			return fmt.Errorf("%s %s on %s: %d %s", method, path, inst.Name, status, bytes.TrimSpace(raw))
		}
		if out != nil {
			if err := json.Unmarshal(raw, out); err != nil {
				return fmt.Errorf("%s %s: decode: %w", method, path, err)
			}
		}
		return nil
	}
	return fmt.Errorf("%s %s on %s: %w", method, path, inst.Name, last)
}

func do(ctx context.Context, inst Instance, token, method, path string, body []byte) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, inst.URL+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := callClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}
