package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCausesReadsTheErrorBehindEach500(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.log")
	os.WriteFile(path, []byte(`{"level":"INFO","msg":"request","request_id":"a","status":200}
{"level":"ERROR","msg":"unhandled error","request_id":"b","err":"users: failed to connect to 127.0.0.1:5433"}
not json
{"level":"ERROR","msg":"unhandled error","request_id":"c","err":"conn closed"}
`), 0o644)
	got := causes([]string{path, filepath.Join(t.TempDir(), "missing.log")})
	if len(got) != 2 || got["b"] != "users: failed to connect to #.#.#.#:#" || got["c"] != "conn closed" {
		t.Fatalf("causes = %v", got)
	}
}
