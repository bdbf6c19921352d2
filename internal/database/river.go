package database

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"
)

// RiverMigrationVersion is the goose version that applies River's own
// schema (river_job, river_queue, …; internal/events uses River as a
// transport). Written as a Go migration so River's SQL stays River's:
// rivermigrate applies every River version this build knows, each in its
// own transaction (River's versions cannot share one: a later one uses an
// enum value an earlier one adds), through River's database/sql driver
// (goose runs on database/sql), while goose holds its session lock. A River upgrade that brings new River versions adds a new
// goose version calling riverUp again; rivermigrate skips what is applied.
const RiverMigrationVersion = 31

func riverMigration() *goose.Migration {
	return goose.NewGoMigration(RiverMigrationVersion,
		&goose.GoFunc{RunDB: riverUp},
		&goose.GoFunc{RunDB: riverDown})
}

func riverUp(ctx context.Context, db *sql.DB) error {
	m, err := rivermigrate.New(riverdatabasesql.New(db), nil)
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate up: %w", err)
	}
	return nil
}

func riverDown(ctx context.Context, db *sql.DB) error {
	m, err := rivermigrate.New(riverdatabasesql.New(db), nil)
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	// TargetVersion -1: every River version, down to no River tables at all.
	if _, err := m.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1}); err != nil {
		return fmt.Errorf("river migrate down: %w", err)
	}
	return nil
}

// RiverVersion is the newest River schema version this build applies; the
// test template's name includes it, so a River upgrade gets a fresh one.
func RiverVersion() int {
	m, err := rivermigrate.New(riverdatabasesql.New(nil), nil)
	if err != nil {
		return 0
	}
	all := m.AllVersions()
	return all[len(all)-1].Version
}
