package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbSnapshot is every table of the database — the app's, the fakes'
// schemas, goose's — as a row count and a hash of its rows, so a test can
// prove a refused request changed nothing at all.
type dbSnapshot map[string]tableState

type tableState struct {
	Rows int64
	Hash string
}

// snapshotDB reads every table in every schema but PostgreSQL's own. A test
// comparing snapshots runs its server with EVENTS_WORKERS=off, so that no
// relay or consumer changes rows behind its back.
func snapshotDB(t testing.TB, pool *pgxpool.Pool) dbSnapshot {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		SELECT format('%I.%I', table_schema, table_name)
		  FROM information_schema.tables
		 WHERE table_type = 'BASE TABLE'
		   AND table_schema NOT IN ('pg_catalog', 'information_schema')
		   -- the rate limiter's own buckets: a refused request spends a token
		   -- by design, and that is no write of the request's
		   AND (table_schema, table_name) <> ('public', 'rate_buckets')
		 ORDER BY 1`)
	if err != nil {
		t.Fatalf("snapshot: list tables: %v", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("snapshot: list tables: %v", err)
	}
	// One statement over every table: every column as text, in a stable
	// order, so any change to any row shows.
	parts := make([]string, len(tables))
	for i, table := range tables {
		parts[i] = fmt.Sprintf(`SELECT %s, count(*), coalesce(md5(string_agg(r::text, E'\n' ORDER BY r::text)), '') FROM %s AS r`,
			quoteLiteral(table), table)
	}
	rows, err = pool.Query(ctx, strings.Join(parts, "\nUNION ALL\n"))
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	snap := dbSnapshot{}
	for rows.Next() {
		var name string
		var st tableState
		if err := rows.Scan(&name, &st.Rows, &st.Hash); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		snap[name] = st
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return snap
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// digest is one hash of the whole snapshot.
func (s dbSnapshot) digest() []byte {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s %d %s\n", n, s[n].Rows, s[n].Hash)
	}
	return h.Sum(nil)
}

// diff names the tables that differ between s and after.
func (s dbSnapshot) diff(after dbSnapshot) string {
	var out []string
	for n, st := range s {
		if a, ok := after[n]; !ok {
			out = append(out, n+": gone")
		} else if a != st {
			out = append(out, fmt.Sprintf("%s: %d rows → %d rows", n, st.Rows, a.Rows))
		}
	}
	for n := range after {
		if _, ok := s[n]; !ok {
			out = append(out, n+": new")
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
