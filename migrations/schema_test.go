package migrations_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/testdb"
)

// schema.sql is the schema the migrations make: a migrated test database,
// dumped the way scripts/schema.sh dumps, reads the same line for line.
// A migration added without `make generate` fails here (and in make lint).
func TestSchemaFileIsTheMigratedSchema(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pg_dump"); err != nil {
		t.Fatalf("pg_dump is not on PATH (Debian: apt-get install postgresql-client): %v", err)
	}
	db := testdb.New(t)
	got, err := exec.Command("../scripts/schema.sh", "dump", db.URL).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("scripts/schema.sh dump: %v\n%s", err, stderr)
	}
	want, err := os.ReadFile("schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("schema.sql is stale from line %d: the migrations make %q, the file says %q; run 'make generate' and commit it", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("schema.sql is stale: the migrations make %d lines, the file has %d; run 'make generate' and commit it", len(gl), len(wl))
	}
}
