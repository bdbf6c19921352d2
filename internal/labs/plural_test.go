package labs

import "testing"

// A verdict counts in words (issue 29, finding 25: "1 effects").
func TestPluralInVerdicts(t *testing.T) {
	if got := plural(1, "effect"); got != "1 effect" {
		t.Errorf("%q", got)
	}
	if got := plural(int64(2), "refund"); got != "2 refunds" {
		t.Errorf("%q", got)
	}
}
