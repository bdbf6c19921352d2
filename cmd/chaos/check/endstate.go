package check

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/cmd/chaos/workload"
)

// Source is where the end state is read.
type Source struct {
	App         workload.Instance   // any serving app instance
	Instances   []workload.Instance // replays go to each in turn
	AdminToken  string
	Customers   []workload.Customer
	ProviderURL string // the fake provider itself, for its effects ledger
}

// Fetch reads the end state through the API, and replays every answered
// intent. Run it only once the system has healed and drained.
func Fetch(ctx context.Context, src Source, intents []history.Intent) (EndState, error) {
	end := EndState{
		Policies:   map[int64]string{},
		Operations: map[int64]Operation{},
		Bookings:   map[int64]Booking{},
		Replays:    map[int]history.Attempt{},
		Effects:    map[int64]int{},
	}
	for _, cu := range src.Customers {
		var ps []struct {
			ID     int64  `json:"id"`
			Status string `json:"status"`
		}
		if err := list(ctx, src.App, cu.Token, "/api/v1/policies?", &ps); err != nil {
			return end, err
		}
		for _, p := range ps {
			end.Policies[p.ID] = p.Status
		}
		var bs []Booking
		if err := list(ctx, src.App, cu.Token, "/api/v1/bookings?", &bs); err != nil {
			return end, err
		}
		for _, b := range bs {
			b.User = cu.Name
			end.Bookings[b.ID] = b
		}
	}

	// Every operation an answer named, read as its owner.
	type opRef struct {
		id    int64
		token string
	}
	var refs []opRef
	seen := map[int64]bool{}
	for i := range intents {
		in := &intents[i]
		a := in.FinalAnswer()
		if in.Kind != history.Cancel || a == nil {
			continue
		}
		b := parse(a)
		for _, id := range []int64{b.ID, b.OperationID} {
			if id != 0 && !seen[id] {
				seen[id] = true
				refs = append(refs, opRef{id, in.Token})
			}
		}
	}
	var mu sync.Mutex
	err := parallel(ctx, len(refs), func(i int) error {
		op, err := operation(ctx, src.App, refs[i].token, refs[i].id)
		if err != nil {
			return err
		}
		mu.Lock()
		end.Operations[op.ID] = op
		mu.Unlock()
		return nil
	})
	if err != nil {
		return end, err
	}

	var waiting struct {
		Items []Operation `json:"items"`
	}
	if err := workload.Call(ctx, src.App, src.AdminToken, http.MethodGet, "/api/v1/admin/reconciliation", nil, &waiting); err != nil {
		return end, err
	}
	for _, w := range waiting.Items {
		op, err := operation(ctx, src.App, src.AdminToken, w.ID)
		if err != nil {
			return end, err
		}
		end.Waiting = append(end.Waiting, op)
	}

	if err := workload.Call(ctx, src.App, src.AdminToken, http.MethodGet, "/api/v1/invariants?stale_after=10s", nil, &end.Invariants); err != nil {
		return end, err
	}

	var events struct {
		Overview Events `json:"overview"`
	}
	if err := workload.Call(ctx, src.App, src.AdminToken, http.MethodGet, "/api/v1/events", nil, &events); err != nil {
		return end, err
	}
	end.Events = events.Overview

	var effects struct {
		ByPolicy []struct {
			PolicyID int64 `json:"policy_id"`
			Count    int   `json:"count"`
		} `json:"by_policy"`
		Late *struct {
			Total int64 `json:"total"`
		} `json:"late"`
	}
	if err := workload.Call(ctx, workload.Instance{Name: "provider", URL: src.ProviderURL}, "", http.MethodGet, "/v1/effects", nil, &effects); err != nil {
		return end, err
	}
	for _, e := range effects.ByPolicy {
		end.Effects[e.PolicyID] = e.Count
	}
	if effects.Late != nil {
		end.Late = effects.Late.Total
	}

	// The replay of every answered key, spread over the instances.
	rp := workload.NewReplayer(10 * time.Second)
	defer rp.Close()
	var answered []*history.Intent
	for i := range intents {
		if intents[i].FinalAnswer() != nil {
			answered = append(answered, &intents[i])
		}
	}
	err = parallel(ctx, len(answered), func(i int) error {
		a := rp.Send(ctx, src.Instances[i%len(src.Instances)], answered[i])
		mu.Lock()
		end.Replays[answered[i].ID] = a
		mu.Unlock()
		return nil
	})
	return end, err
}

// operation reads GET /api/v1/operations/{id} with the provider's truth.
func operation(ctx context.Context, app workload.Instance, token string, id int64) (Operation, error) {
	var v struct {
		Operation
		Provider struct {
			Truth string `json:"truth"`
		} `json:"provider"`
		Steps []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"steps"`
		Truths map[string]struct {
			Truth string `json:"truth"`
		} `json:"truths"`
	}
	if err := workload.Call(ctx, app, token, http.MethodGet, "/api/v1/operations/"+strconv.FormatInt(id, 10), nil, &v); err != nil {
		return Operation{}, fmt.Errorf("check: operation %d: %w", id, err)
	}
	v.Operation.Truth = v.Provider.Truth
	for _, st := range v.Steps {
		if st.State != "DONE" {
			v.Operation.Stuck, v.Operation.StuckState = st.Name, st.State
			if st.State == "SENT" || st.State == "UNKNOWN" {
				v.Operation.StuckTruth = v.Truths[st.Name].Truth
			}
			break
		}
	}
	var timeline []struct {
		At     time.Time `json:"at"`
		Branch string    `json:"branch"`
	}
	json.Unmarshal(v.Operation.Timeline, &timeline)
	for _, e := range timeline {
		if e.Branch == "claimed" && (v.Operation.Claimed.IsZero() || e.At.Before(v.Operation.Claimed)) {
			v.Operation.Claimed = e.At
		}
	}
	return v.Operation, nil
}

// list follows a paginated list to its end, decoding items into out.
func list[T any](ctx context.Context, app workload.Instance, token, path string, out *[]T) error {
	cursor := ""
	for {
		p := path + "&limit=1000"
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		var page struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor *string           `json:"next_cursor"`
		}
		if err := workload.Call(ctx, app, token, http.MethodGet, p, nil, &page); err != nil {
			return err
		}
		for _, raw := range page.Items {
			var v T
			if err := json.Unmarshal(raw, &v); err != nil {
				return err
			}
			*out = append(*out, v)
		}
		if page.NextCursor == nil {
			return nil
		}
		cursor = *page.NextCursor
	}
}

// parallel runs fn(0…n-1), eight at a time, and returns the first error.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	sem := make(chan struct{}, 8)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() { defer wg.Done(); defer func() { <-sem }(); errs[i] = fn(i) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func sortedBookings(m map[int64]Booking) []Booking {
	out := make([]Booking, 0, len(m))
	for _, b := range m {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Booking) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
