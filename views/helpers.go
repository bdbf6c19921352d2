package views

import (
	"net/http"
	"strconv"
)

func httpStatusText(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Error"
}

func int64Text(n int64) string { return strconv.FormatInt(n, 10) }

// statusClass maps a status to the CSS class family that colours it.
func statusClass(status string) string {
	switch status {
	case "ACTIVE", "AVAILABLE", "SUCCEEDED", "COMPLETED", "CONFIRMED":
		return "ok"
	case "CANCELLED", "BOOKED", "FAILED", "REJECTED":
		return "done"
	case "IN_PROGRESS", "RECOVERING", "RUNNING":
		return "busy"
	case "NEEDS_RECONCILIATION":
		return "alert"
	default:
		return "neutral"
	}
}

func slotLabel(status string) string {
	if status == "AVAILABLE" {
		return "free"
	}
	return "booked"
}
