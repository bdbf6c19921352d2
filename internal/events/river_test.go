package events_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/testdb"
)

// setupRiver returns a fresh database whose events travel on River.
func setupRiver(t testing.TB) *bundle {
	t.Helper()
	b := &bundle{db: testdb.New(t), transport: events.TransportRiver}
	b.injector = events.NewInjector(b.db.Pool)
	b.userID = demoUser(t, b.db)
	if err := events.SetTransport(context.Background(), b.db.Pool, events.TransportRiver); err != nil {
		t.Fatal(err)
	}
	return b
}

// startRiverConsumers runs `instances` River clients, each working both
// consumers' queues, until the test ends.
func (b *bundle) startRiverConsumers(t testing.TB, instances int, cfg events.RiverConfig, sw *crash.Switch) {
	t.Helper()
	for i := range instances {
		var hs []*events.Handler
		for _, c := range []events.Consumer{events.Notifications{}, events.Ledger{}, events.History{}} {
			hs = append(hs, events.NewHandler(b.db.Pool, c, events.HandlerConfig{
				Transport: events.TransportRiver, Instance: fmt.Sprintf("river-%d", i+1), Crash: sw}))
		}
		c := cfg
		c.ID = fmt.Sprintf("river-%d-%s", i+1, uniqueName(""))
		c.Injector = b.injector
		c.PollInterval = cmp.Or(c.PollInterval, 100*time.Millisecond)
		c.RetryAfter = cmp.Or(c.RetryAfter, 100*time.Millisecond)
		r, err := events.NewRiverConsumers(b.db.Pool, hs, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r.Stop(ctx)
		})
	}
}

func TestRiverEveryEventAppliedOncePerConsumer(t *testing.T) {
	t.Parallel()
	b := setupRiver(t)
	ids := b.write(t, 20)
	b.startRiverConsumers(t, 2, events.RiverConfig{}, nil)
	b.waitApplied(t, ids, 20*time.Second)
}

// A River worker dies after its commit and before River records the job
// complete (a panic here; River counts it a failed attempt): River runs the
// job again and the inbox answers "duplicate".
func TestRiverConsumerCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	b := setupRiver(t)
	ids := b.write(t, 1)
	b.startRiverConsumers(t, 2, events.RiverConfig{}, abandonAt(t, events.CrashConsumerAfterCommitBeforeAck))
	b.waitApplied(t, ids, 20*time.Second)
	waitFor(t, 15*time.Second, "the rerun to be caught by the inbox", func() bool {
		return b.deliveries(t, ids[0])[events.OutcomeDuplicate] == 1
	})
	b.assertOnce(t, ids)
}

func TestInjectorModesOnRiver(t *testing.T) {
	t.Parallel()
	for _, mode := range events.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setupRiver(t)
			// lose_ack waits for the job timeout; hold_past_deadline for
			// the rescuer (RescueAfter, then River's rescuer pass, every 30 s).
			// Not shorter: a job that merely runs slowly (a loaded machine)
			// past either is run again, one duplicate more than injected.
			cfg := events.RiverConfig{JobTimeout: 5 * time.Second, RescueAfter: 10 * time.Second}
			checkInjectedMode(t, b, mode, func(context.Context) *events.Relay {
				b.startRiverConsumers(t, 2, cfg, nil)
				return nil
			})
		})
	}
}
