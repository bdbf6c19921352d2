package pgcluster

import (
	"testing"

	"github.com/idemlab/idemlab/internal/testenv"
)

// ForTest starts a cluster for one test and closes it when the test ends.
// It never skips: without the server binaries (or, as root, without an
// unprivileged user to run them) the test fails and says what to install,
// because a suite that skips its crash tests proves nothing.
func ForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testenv.SkipIfShort(t, "starts a PostgreSQL server of its own")
	c, err := Start(opts)
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
		return nil // a testing.TB whose Fatalf returns (a test of ForTest)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgcluster: server log (%s) ends:\n%s", c.LogPath(), c.logTail(3000))
		}
		if err := c.Close(); err != nil {
			t.Logf("pgcluster: close: %v", err)
		}
	})
	return c
}

// StandbyForTest starts a streaming standby of primary for one test and
// closes it when the test ends.
func StandbyForTest(t testing.TB, primary *Cluster, opts Options) *Cluster {
	t.Helper()
	c, err := StartStandby(primary, opts)
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
		return nil
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgcluster: standby log (%s) ends:\n%s", c.LogPath(), c.logTail(3000))
		}
		if err := c.Close(); err != nil {
			t.Logf("pgcluster: close standby: %v", err)
		}
	})
	return c
}

// BouncerForTest starts a PgBouncer in transaction mode in front of c for
// one test and stops it when the test ends.
func BouncerForTest(t testing.TB, c *Cluster, poolSize int) *Bouncer {
	t.Helper()
	b, err := StartBouncer(c, poolSize)
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
		return nil
	}
	t.Cleanup(func() { b.Close() })
	return b
}
