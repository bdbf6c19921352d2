package users

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzSessionID: a cookie value is looked up only if it has the shape of
// the ids StartSession makes (43 characters of unpadded base64url, 256
// bits); anything else costs no query.
func FuzzSessionID(f *testing.F) {
	for _, s := range []string{"", strings.Repeat("A", 43), strings.Repeat("A", 44), "1.1700000000.sig", "../../etc/passwd",
		"'; DROP TABLE sessions; --", strings.Repeat("_", 43), strings.Repeat("=", 43), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !validSessionID(s) {
			return
		}
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(b) != sessionIDBytes || len(s) != 43 {
			t.Fatalf("%q accepted as a session id", s)
		}
	})
}
