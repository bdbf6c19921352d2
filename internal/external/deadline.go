package external

import (
	"fmt"
	"net/http"
	"time"
)

// DeadlineHeader carries the latest moment a call may still be applied.
const DeadlineHeader = "Request-Deadline"

// deadlineLayout is RFC 3339 in UTC with exactly three fractional digits:
// 2025-06-01T12:00:02.345Z.
const deadlineLayout = "2006-01-02T15:04:05.000Z07:00"

// FormatDeadline writes t as a Request-Deadline value. Precision is a
// millisecond; t is truncated, never rounded up, so the header never
// promises a later moment than the caller chose.
func FormatDeadline(t time.Time) string {
	return t.UTC().Truncate(time.Millisecond).Format(deadlineLayout)
}

// ParseDeadline reads a Request-Deadline value: RFC 3339, any offset, any
// fractional precision.
func ParseDeadline(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("external: %s %q is not an RFC 3339 time such as 2025-06-01T12:00:02.345Z", DeadlineHeader, s)
	}
	return t, nil
}

// RequestDeadline returns the deadline r carries. ok is false when r carries
// none; err is set when the header is there but unreadable.
func RequestDeadline(r *http.Request) (deadline time.Time, ok bool, err error) {
	v := r.Header.Get(DeadlineHeader)
	if v == "" {
		return time.Time{}, false, nil
	}
	t, err := ParseDeadline(v)
	if err != nil {
		return time.Time{}, false, err
	}
	return t, true, nil
}
