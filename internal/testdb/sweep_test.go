package testdb

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A killed run's database (older than this process, nobody connected) is
// dropped by the next run; a live one — connected, or younger — is not.
// Both namings: the age in the name, and the older idemlab_test_<hex>,
// whose age is its directory's.
func TestSweepDropsOnlyLeftovers(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// A prefix of its own: the real sweeps (prefix) and this test's
	// never touch each other's databases on a shared server.
	prefix := "idemlab_sweeptest_" + randomHex(3) + "_"
	old := processStart.Add(-2 * time.Hour).Unix()
	leftover := fmt.Sprintf("%s%d_%s", prefix, old, randomHex(6))
	connected := fmt.Sprintf("%s%d_%s", prefix, old, randomHex(6))
	young := fmt.Sprintf("%s%d_%s", prefix, time.Now().Add(2*time.Hour).Unix(), randomHex(6))
	oldStyle := prefix + randomHex(6)
	oldStyleConnected := prefix + randomHex(6)
	for _, name := range []string{leftover, connected, young, oldStyle, oldStyleConnected} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drop(adminURL(), name) })
	}
	for _, name := range []string{connected, oldStyleConnected} {
		live, err := pgx.Connect(ctx, withDatabase(adminURL(), name))
		if err != nil {
			t.Fatal(err)
		}
		defer live.Close(ctx)
	}
	check := func(when string, want map[string]bool) {
		t.Helper()
		for name, want := range want {
			var exists bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if exists != want {
				t.Errorf("%s: %s exists = %v, want %v", when, name, exists, want)
			}
		}
	}

	// As a test binary does: the old-style databases were created just now,
	// after this process started — a live run's, for all the sweep knows.
	sweepLeftovers(ctx, conn, prefix, processStart.Add(-time.Minute))
	check("after the sweep", map[string]bool{leftover: false, connected: true, young: true, oldStyle: true, oldStyleConnected: true})

	// As a binary started an hour from now would: the old-style database
	// nobody is connected to is a leftover by then; the connected one is not.
	sweepLeftovers(ctx, conn, prefix, time.Now().Add(time.Hour))
	check("after a later sweep", map[string]bool{connected: true, oldStyle: false, oldStyleConnected: true})
}
