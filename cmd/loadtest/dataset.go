package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// dataset is what the workload acts on: the customers with their tokens,
// the ACTIVE policies each one may cancel (each handed out once), and the
// slots.
type dataset struct {
	customers []customer
	policies  []policyRef // shuffled; next hands each out once
	next      atomic.Int64
	slots     []int64
	nextSlot  atomic.Int64 // takeSlot hands each slot out once
}

type customer struct {
	name  string
	token string
}

type policyRef struct {
	owner int // index into customers
	id    int64
}

// takePolicy hands out an ACTIVE policy no other intent has had, or false
// when they are used up.
func (d *dataset) takePolicy() (policyRef, bool) {
	i := d.next.Add(1) - 1
	if i >= int64(len(d.policies)) {
		return policyRef{}, false
	}
	return d.policies[i], true
}

// takeSlot hands out a slot no other intent has had, or false when they
// are used up: bookings that never contend.
func (d *dataset) takeSlot() (int64, bool) {
	i := d.nextSlot.Add(1) - 1
	if i >= int64(len(d.slots)) {
		return 0, false
	}
	return d.slots[i], true
}

// demoCustomers are used with -reset=false: the tokens every fresh app
// seeds (DEMO_TOKENS can change them; then reset instead).
var demoCustomers = []customer{{"alice", "demo-alice"}, {"bob", "demo-bob"}, {"carol", "demo-carol"}}

// loadDataset resets the app (unless -reset=false) and reads back what the
// workload needs through the API.
func loadDataset(ctx context.Context, c *client, cfg config) (*dataset, error) {
	d := &dataset{}
	if cfg.Reset {
		var out struct {
			Users []struct {
				Name, Role, Token string
			} `json:"users"`
		}
		in := map[string]int{"users": cfg.Users, "policies_per_user": cfg.PoliciesPerUser, "slots": cfg.Slots}
		if scenarios[cfg.Scenario].depositSlots {
			in["slots"], in["deposit_slots"] = 1, cfg.Slots // one plain slot: a dataset needs one
		}
		if err := c.admin(ctx, "POST", "/api/v1/admin/reset", in, &out); err != nil {
			return nil, fmt.Errorf("reset (does the app run with DEMO_MODE=true?): %w", err)
		}
		for _, u := range out.Users {
			if u.Role == "customer" {
				d.customers = append(d.customers, customer{u.Name, u.Token})
			}
		}
	} else {
		d.customers = demoCustomers
	}
	if len(d.customers) == 0 {
		return nil, fmt.Errorf("the dataset has no customers")
	}

	// Each customer's ACTIVE policies, eight customers at a time.
	perCustomer := make([][]int64, len(d.customers))
	errs := make([]error, len(d.customers)+1)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, cu := range d.customers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			perCustomer[i], errs[i] = listIDs(ctx, c, cu.token, "/api/v1/policies?status=ACTIVE")
		}()
	}
	var slotIDs []int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		path := "/api/v1/slots?"
		if scenarios[cfg.Scenario].depositSlots {
			path = "/api/v1/slots?deposit=true&" // the deposit saga's slots only
		}
		slotIDs, errs[len(d.customers)] = listIDs(ctx, c, c.adminTo, path)
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, ids := range perCustomer {
		for _, id := range ids {
			d.policies = append(d.policies, policyRef{owner: i, id: id})
		}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	rng.Shuffle(len(d.policies), func(i, j int) { d.policies[i], d.policies[j] = d.policies[j], d.policies[i] })
	d.slots = slotIDs
	if len(d.slots) == 0 {
		return nil, fmt.Errorf("the dataset has no slots")
	}
	return d, nil
}

// listIDs follows a paginated list to its end and returns the items' ids.
func listIDs(ctx context.Context, c *client, token, path string) ([]int64, error) {
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
		if err := c.call(ctx, token, "GET", p, nil, &page); err != nil {
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

// vacuum readies the dataset as the floor's runs are readied, after the
// reset and the warm-up: ANALYZE makes every connection of the app plan its
// cached statements again for tables that are no longer empty (see -warmup),
// VACUUM has the reset's new rows visited once already, and CHECKPOINT keeps
// a checkpoint from starting mid-run.
func vacuum(ctx context.Context, databaseURL string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("-vacuum: %w", err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{"VACUUM ANALYZE", "CHECKPOINT"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("-vacuum: %s: %w", sql, err)
		}
	}
	return nil
}
