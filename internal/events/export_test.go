package events

import (
	"context"
	"time"
)

// Test access to the loops' single passes (STYLE: tests call runOnce).

func (r *Relay) RunOnce(ctx context.Context) (RelayCounts, error) { return r.runOnce(ctx) }

func (r *Relay) Purge(ctx context.Context, at time.Time) (int, error) { return r.purge(ctx, &at) }

func (c *NATSConsumer) RunOnce(ctx context.Context) (int, error) { return c.runOnce(ctx) }

func (c *KafkaConsumer) RunOnce(ctx context.Context) (int, error) { return c.runOnce(ctx) }
