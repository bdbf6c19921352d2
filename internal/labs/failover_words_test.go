package labs

import (
	"fmt"
	"strings"
	"testing"
)

// The failover lab's duration is stated as measured — about 15 s on an idle
// machine (13.1 s by the third reader), longer on a busy one — and with
// the bound it gives up at, not "about half a minute" (issue 29, finding 14).
func TestFailoverSaysHowLongItTakes(t *testing.T) {
	for _, text := range []string{failoverLab.Try, failoverLab.RunHint} {
		if strings.Contains(text, "half a minute") || !strings.Contains(text, "about 15 s on an idle machine") {
			t.Errorf("the failover lab says %q", text)
		}
	}
	if bound := fmt.Sprintf("gives up at %d minutes", int(failoverBound.Minutes())); !strings.Contains(failoverLab.RunHint, bound) {
		t.Errorf("the failover lab's hint does not say it %s: %q", bound, failoverLab.RunHint)
	}
}
