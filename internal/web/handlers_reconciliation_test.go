package web

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/reconciliation"
)

// A decision reads in a person's words on the desk (issue 29's second read,
// finding 21: the notice said "decision recorded (mark_done)", the list of
// decisions showed the code name): the notice and the list say what was
// decided, never the API's action name.
func TestDeskSaysDecisionsInWords(t *testing.T) {
	for action, want := range map[string]string{
		"mark_done":      "marked done",
		"mark_cancelled": "marked done", // the cancellation's older name for mark_done
		"retry":          "handed back to recovery",
		"mark_failed":    "marked failed",
	} {
		notice := deskNotice(url.Values{"resolved": {"12"}, "action": {action}})
		row := decisionRow(reconciliation.Decision{At: time.Now(), OperationID: 12, Decision: action})
		for _, said := range []string{notice, row.Decision} {
			if !strings.Contains(said, want) {
				t.Errorf("%s reads %q, want %q", action, said, want)
			}
			for _, code := range []string{"mark_done", "mark_cancelled", "mark_failed", "(retry)"} {
				if strings.Contains(said, code) {
					t.Errorf("%s reads %q: the code name %s where words belong", action, said, code)
				}
			}
		}
		if strings.Count(notice, "(") != strings.Count(notice, ")") {
			t.Errorf("unbalanced parentheses: %q", notice)
		}
	}
}
