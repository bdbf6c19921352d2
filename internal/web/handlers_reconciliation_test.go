package web

import (
	"net/url"
	"strconv"
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

// Asking again says what became of the items when recovery settled them
// first (issue 29, finding 16): the desk's own "Try this" — heal, then ask
// again — races recovery's re-ask, and the notice said "Asked again: 0 of
// 0 answered" above "Nothing needs a person" with no word of who finished
// them.
func TestAskingAgainSaysRecoverySettledThemFirst(t *testing.T) {
	q := func(asked, answered, posted, waiting, byRecovery, byPerson int) url.Values {
		v := url.Values{}
		for k, n := range map[string]int{"asked": asked, "answered": answered, "posted": posted, "waiting": waiting,
			"by_recovery": byRecovery, "by_person": byPerson} {
			v.Set(k, strconv.Itoa(n))
		}
		return v
	}
	for _, tc := range []struct {
		name      string
		q         url.Values
		want, not []string
	}{
		{"all settled before the press", q(0, 0, 3, 0, 3, 0),
			[]string{"Nothing was asked again", "3 of the 3 you asked about no longer wait", "recovery settled 3 on its own", "before you asked", "None of them waits"},
			[]string{"0 of 0", "cards below"}},
		{"settled while asked", q(1, 1, 1, 0, 1, 0),
			[]string{"Asked again: 1 of 1 answered", "1 of the 1 you asked about no longer waits", "recovery settled 1", "while you asked", "None of them waits"},
			[]string{"before you asked", "cards below"}},
		{"some before, some while, one by a person, one still waiting", q(3, 3, 4, 1, 2, 1),
			[]string{"3 of the 4", "recovery settled 2", "another admin decided 1", "1 before you asked, 2 while you asked", "The cards below advise"},
			[]string{"None of them"}},
		{"all still waiting", q(2, 0, 2, 2, 0, 0),
			[]string{"Asked again: 0 of 2 answered", "The cards below advise"},
			[]string{"no longer", "recovery settled"}},
	} {
		got := deskNotice(tc.q)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("%s: %q says %q", tc.name, got, n)
			}
		}
	}
}
