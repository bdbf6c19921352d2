package web

import (
	"testing"

	"github.com/idemlab/idemlab/internal/labs"
)

// A person clicking through the labs must not meet the labs' limit (issue
// 29, finding 22): every lab run once — the numbered labs, the race lab and
// the double-click lab — and each run again (a double-click on a lab's
// button spends two runs of the bucket before the key makes it one run)
// fit in the default burst.
func TestTheLabsLimitLetsAPersonClickThroughEveryLab(t *testing.T) {
	walk := len(labs.All()) + 2 // + /labs/race and a policy's double-click lab
	if got := DefaultRateLimits.Labs.Events; got < 2*walk {
		t.Errorf("the labs' default burst is %d (%s); clicking through the %d labs and running each again spends %d",
			got, DefaultRateLimits.Labs, walk, 2*walk)
	}
}
