package pgcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/pgcluster"
)

// The failover window in PostgreSQL itself: the standby is cut off from the
// primary (paused streaming: a lagging standby, a network blip), a row is
// written, the primary dies and the standby is promoted. Asynchronous: the
// commit was acknowledged and the promoted standby never had it. With a
// synchronous standby the commit is not acknowledged while the standby
// cannot have it — the writer waits — so nothing acknowledged is lost.
func TestFailoverLosesAcknowledgedCommitsOnlyWithoutASynchronousStandby(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		settings map[string]string
	}{
		{"async", nil},
		{"sync", pgcluster.Synchronous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			primary := pgcluster.ForTest(t, pgcluster.Options{Settings: tc.settings})
			standby := pgcluster.StandbyForTest(t, primary, pgcluster.Options{})
			conn := connect(t, primary.URL())
			if _, err := conn.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1)`); err != nil {
				t.Fatal(err)
			}
			if err := standby.CaughtUp(primary); err != nil {
				t.Fatal(err)
			}
			if err := standby.PauseStreaming(); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := conn.Exec(wctx, `INSERT INTO t VALUES (2)`)
			acknowledged := err == nil
			if err := primary.Stop(true); err != nil {
				t.Fatal(err)
			}
			if err := standby.Promote(); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := connect(t, standby.URL()).QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			lost := acknowledged && n < 2
			t.Logf("%s: the second insert acknowledged %v, the promoted standby has %d rows", tc.name, acknowledged, n)
			if want := tc.name == "async"; lost != want {
				t.Fatalf("acknowledged %v, %d rows after the failover: lost = %v, want %v", acknowledged, n, lost, want)
			}
			// The promoted standby takes writes alone.
			if _, err := connect(t, standby.URL()).Exec(ctx, `INSERT INTO t VALUES (3)`); err != nil {
				t.Fatalf("write on the promoted standby: %v", err)
			}
		})
	}
}
