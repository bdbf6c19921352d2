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
func TestSweepDropsOnlyLeftovers(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	old := processStart.Add(-2 * time.Hour).Unix()
	leftover := fmt.Sprintf("%s%d_%s", namePrefix, old, randomHex(6))
	connected := fmt.Sprintf("%s%d_%s", namePrefix, old, randomHex(6))
	young := fmt.Sprintf("%s%d_%s", namePrefix, time.Now().Unix(), randomHex(6))
	for _, name := range []string{leftover, connected, young} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drop(adminURL(), name) })
	}
	live, err := pgx.Connect(ctx, withDatabase(adminURL(), connected))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close(ctx)

	sweepLeftovers(ctx, conn)
	for name, want := range map[string]bool{leftover: false, connected: true, young: true} {
		var exists bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists != want {
			t.Errorf("after the sweep %s exists = %v, want %v", name, exists, want)
		}
	}
}
