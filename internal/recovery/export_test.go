package recovery

import (
	"context"
	"time"
)

// RunOnce exposes runOnce to the package's external tests.
func (l *Loop) RunOnce(ctx context.Context) (Counts, error) { return l.runOnce(ctx) }

// SetNow makes the loop's staleness test read t instead of the database
// clock (nil restores it): tests move time instead of sleeping.
func (l *Loop) SetNow(t *time.Time) { l.now.Store(t) }
