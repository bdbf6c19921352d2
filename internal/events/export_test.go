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

// StreamLeader names the server that leads the stream (in a cluster).
func (n *NATS) StreamLeader(ctx context.Context) (string, error) {
	info, err := n.stream.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil {
		return "", nil
	}
	return info.Cluster.Leader, nil
}
