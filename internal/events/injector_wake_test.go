package events

import (
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/testdb"
)

// Arming the injector ends this process's "nothing armed" trust only once
// the arming has committed (issue 29, finding 28: six events went out
// uninjected after an arming). A delivery that looks while the arming is
// still inside its transaction sees nothing and trusts it; the commit's
// wake ends that trust, so the next delivery is injected.
func TestArmingEndsTheNothingArmedTrustAfterItsCommit(t *testing.T) {
	db := testdb.New(t)
	ctx := t.Context()
	in := NewInjector(db.Pool)
	if m, err := in.take(ctx, ConsumerLedger, DeliverTwice); err != nil || m != "" {
		t.Fatalf("nothing armed: took %q, %v", m, err)
	}
	if !in.quiet() {
		t.Fatal("a take that found nothing armed does not trust it")
	}
	looked := false
	in.inArming = func() {
		in.mu.Lock()
		in.idleUntil = time.Time{} // the trust has just run out: the next delivery looks
		in.mu.Unlock()
		m, err := in.take(ctx, ConsumerLedger, DeliverTwice)
		if err != nil || m != "" {
			t.Errorf("a look inside the arming's transaction took %q, %v", m, err)
		}
		looked = in.quiet() // it saw nothing, and trusts that
	}
	if _, err := in.Set(ctx, DeliverTwice, "", 1); err != nil {
		t.Fatal(err)
	}
	if !looked {
		t.Fatal("the look inside the arming did not trust 'nothing': the test did not make the window")
	}
	if in.quiet() {
		t.Fatal("after the arming's commit the process still trusts 'nothing armed': the next deliveries go out uninjected")
	}
	if m, err := in.take(ctx, ConsumerLedger, DeliverTwice); err != nil || m != DeliverTwice {
		t.Errorf("the first delivery after arming: %q, %v, want %s", m, err, DeliverTwice)
	}
}

// A look that began before an arming's commit and ends after its wake does
// not bring the trust back: it may have read the script before the commit.
func TestALookThatStraddlesTheWakeIsNotTrusted(t *testing.T) {
	db := testdb.New(t)
	in := NewInjector(db.Pool)
	in.mu.Lock()
	seen := in.woken // the look begins
	in.mu.Unlock()
	if _, err := in.Set(t.Context(), DeliverTwice, "", 1); err != nil { // the arming commits and wakes
		t.Fatal(err)
	}
	in.trustNothing(seen) // the look ends: it saw nothing
	if in.quiet() {
		t.Fatal("a look begun before the arming's wake made the process trust 'nothing armed'")
	}
}
