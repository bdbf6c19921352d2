// Package pause is the one way idemlab's loops pause — recovery between
// rounds, the relay and consumers after an error, the labs' schedules, the
// load and chaos tools: for a while, or less when their context ends.
package pause

import (
	"context"
	"time"
)

// For waits d, or less when ctx ends first; it reports whether all of d
// passed (false: ctx ended, and the caller should stop).
func For(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
