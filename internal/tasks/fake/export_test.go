package fake

import "context"

// Test access to one dispatch pass (STYLE: tests call runOnce).

func (q *Queue) RunOnce(ctx context.Context) (Counts, error) { return q.runOnce(ctx) }
