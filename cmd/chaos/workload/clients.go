package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// Config shapes the clients.
type Config struct {
	Clients int           // how many customers act at once
	Timeout time.Duration // each attempt's own timeout
	// DoubleSend is the chance that an intent's first attempt goes out
	// twice at once, to both instances (a double-click, a retrying proxy).
	DoubleSend float64
	// ReleaseChance is the chance a client releases a booking it made.
	ReleaseChance float64
	// StopChance is the chance that a cancel answered 202 (its outcome
	// unknown: the operation live) is cancelled by an admin while it runs
	// (POST /api/v1/operations/{id}/cancel, as AdminToken): it must stop
	// before its next step, and the invariants must hold whatever it was
	// doing (issue 27).
	StopChance float64
	AdminToken string
	Seed       uint64
	Nonce      string // makes this run's keys unique
}

// Run is the workload of one chaos run: clients act until Stop, then
// finish what they started.
type Run struct {
	cfg       Config
	d         *Dataset
	instances []Instance
	log       *history.Log

	stopNew  chan struct{} // closed: start no new intent
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Start starts the clients.
func Start(ctx context.Context, cfg Config, d *Dataset, instances []Instance, log *history.Log) *Run {
	r := &Run{cfg: cfg, d: d, instances: instances, log: log, stopNew: make(chan struct{})}
	for i := range cfg.Clients {
		c := &client{
			id:   i + 1,
			run:  r,
			rng:  rand.New(rand.NewPCG(cfg.Seed, uint64(i+1))),
			send: newSender(cfg.Timeout),
		}
		r.wg.Add(1)
		go func() { defer r.wg.Done(); c.loop(ctx) }()
	}
	return r
}

// Stop lets no client start a new intent; the ones in progress go on
// retrying until they are answered or ctx (of Wait) ends.
func (r *Run) Stop() { r.stopOnce.Do(func() { close(r.stopNew) }) }

// Wait waits for every client to finish its last intent.
func (r *Run) Wait() { r.wg.Wait() }

type client struct {
	id   int
	run  *Run
	rng  *rand.Rand
	send *sender
	keys int
}

func (c *client) stopped() bool {
	select {
	case <-c.run.stopNew:
		return true
	default:
		return false
	}
}

// loop is one customer: cancel a policy, or book a slot and perhaps
// release it, with a short think time between intents.
func (c *client) loop(ctx context.Context) {
	defer c.send.close()
	for !c.stopped() && ctx.Err() == nil {
		cu := c.rng.IntN(len(c.run.d.Customers))
		if p, ok := c.maybePolicy(); ok {
			cancel := c.intent(history.Cancel, p.Owner, p.ID, 0)
			if a := c.do(ctx, cancel); a != nil && a.Status == http.StatusAccepted && c.rng.Float64() < c.run.cfg.StopChance {
				if id, ok := createdID(a.Body); ok {
					pause(ctx, time.Duration(c.rng.IntN(300))*time.Millisecond)
					c.do(ctx, c.stop(id, cancel.ID))
				}
			}
		} else {
			slot := c.run.d.Slots[c.rng.IntN(len(c.run.d.Slots))]
			book := c.intent(history.Book, cu, slot, 0)
			if a := c.do(ctx, book); a != nil && a.Status == http.StatusCreated && c.rng.Float64() < c.run.cfg.ReleaseChance {
				if id, ok := createdID(a.Body); ok {
					pause(ctx, time.Duration(c.rng.IntN(300))*time.Millisecond)
					c.do(ctx, c.intent(history.Release, cu, id, book.ID))
				}
			}
		}
		pause(ctx, time.Duration(c.rng.IntN(200))*time.Millisecond)
	}
}

// maybePolicy picks a cancel intent half of the time, while policies last.
func (c *client) maybePolicy() (Policy, bool) {
	if c.rng.IntN(2) == 0 {
		return Policy{}, false
	}
	return c.run.d.takePolicy()
}

// intent mints a new key and registers the intent.
func (c *client) intent(kind string, customer int, subject int64, parent int) *history.Intent {
	c.keys++
	cu := c.run.d.Customers[customer]
	in := &history.Intent{
		Client: c.id, Kind: kind, User: cu.Name, Token: cu.Token, Subject: subject, Parent: parent,
		Key:    fmt.Sprintf("chaos-%s-%d-%d", c.run.cfg.Nonce, c.id, c.keys),
		Method: http.MethodPost,
	}
	switch kind {
	case history.Cancel:
		in.Path = "/api/v1/policies/" + strconv.FormatInt(subject, 10) + "/cancel"
		in.Body = []byte(`{"reason":"chaos"}`)
	case history.Book:
		in.Path = "/api/v1/slots/" + strconv.FormatInt(subject, 10) + "/book"
	case history.Release:
		in.Path = "/api/v1/bookings/" + strconv.FormatInt(subject, 10) + "/cancel"
	}
	return c.run.log.NewIntent(in)
}

// stop mints the admin's intent to cancel live operation opID, which the
// cancel intent parent started.
func (c *client) stop(opID int64, parent int) *history.Intent {
	c.keys++
	return c.run.log.NewIntent(&history.Intent{
		Client: c.id, Kind: history.Stop, User: "admin", Token: c.run.cfg.AdminToken, Subject: opID, Parent: parent,
		Key:    fmt.Sprintf("chaos-%s-%d-%d", c.run.cfg.Nonce, c.id, c.keys),
		Method: http.MethodPost, Path: "/api/v1/operations/" + strconv.FormatInt(opID, 10) + "/cancel",
	})
}

// do sends in until it has a final answer (or ctx ends: abandoned), each
// attempt to the next instance in turn, and returns the final attempt.
func (c *client) do(ctx context.Context, in *history.Intent) *history.Attempt {
	n := len(c.run.instances)
	first := c.rng.IntN(n)
	if c.rng.Float64() < c.run.cfg.DoubleSend && n > 1 {
		// Two copies at once, to two instances: one executes, the other
		// must hear "in progress" or the same answer.
		var wg sync.WaitGroup
		answers := make([]history.Attempt, 2)
		for i := range answers {
			wg.Add(1)
			go func() { defer wg.Done(); answers[i] = c.send.send(ctx, c.run.instances[(first+i)%n], in) }()
		}
		wg.Wait()
		for _, a := range answers {
			c.run.log.Attempted(in, a)
		}
		for _, a := range answers {
			if a.Final() {
				return &a
			}
		}
		first++
	}
	for try := 0; ; try++ {
		if ctx.Err() != nil {
			c.run.log.Abandon(in)
			return nil
		}
		a := c.send.send(ctx, c.run.instances[(first+try)%n], in)
		if ctx.Err() != nil && a.Status == 0 {
			c.run.log.Abandon(in) // the run's end cut it: not the system's answer
			return nil
		}
		c.run.log.Attempted(in, a)
		if a.Final() {
			return &a
		}
		pause(ctx, c.backoff(try, a))
	}
}

// backoff is how long to wait before the next attempt: Retry-After when
// the app says (at most 2 s), else 100 ms doubling to 1.6 s, with jitter.
func (c *client) backoff(try int, a history.Attempt) time.Duration {
	if s, err := strconv.Atoi(a.RetryAfter); err == nil && s > 0 {
		return min(time.Duration(s)*time.Second, 2*time.Second)
	}
	d := 100 * time.Millisecond << min(try, 4)
	return d/2 + time.Duration(c.rng.Int64N(int64(d)))
}

// createdID is the id in a 201 answer (a booking) or a 202 (an operation).
func createdID(body []byte) (int64, bool) {
	var v struct {
		ID int64 `json:"id"`
	}
	if json.Unmarshal(body, &v) != nil || v.ID == 0 {
		return 0, false
	}
	return v.ID, true
}

func pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
