// Package migrations embeds idemlab's goose SQL migrations so the binary carries
// its own schema. Applying them is internal/database's job; this file only embeds.
package migrations

import "embed"

// FS holds every numbered migration, in goose's SQL format (schema.sql,
// the current schema generated from them for readers, is not one).
//
//go:embed 0*.sql
var FS embed.FS
