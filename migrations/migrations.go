// Package migrations embeds idemlab's goose SQL migrations so the binary carries
// its own schema. Applying them is internal/database's job; this file only embeds.
package migrations

import "embed"

// FS holds every numbered migration, in goose's SQL format.
//
//go:embed *.sql
var FS embed.FS
