package recovery_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/recovery"
)

// The bounds are computed once (Config.Bounds) and docs/recovery.md
// quotes that computation's defaults (reader's finding 14: the page said
// 46.5 s, the doc 76.5 s, invariant 6 a formula, and timelines named
// backoffs of 210 s and 5 min that no bound mentioned).
func TestTheDocQuotesTheBoundsOfTheDefaults(t *testing.T) {
	cfg, err := recovery.LoadConfig(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Bounds()
	if b.Claimable != 46500*time.Millisecond || b.AfterCrash != b.Claimable+cfg.Lease || b.Backoff != cfg.MaxBackoff {
		t.Fatalf("bounds of the defaults: %+v", b)
	}
	doc, err := os.ReadFile("../../docs/recovery.md")
	if err != nil {
		t.Fatal(err)
	}
	secs := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s" } // 46.5 s
	for _, want := range []string{"**" + secs(b.Claimable) + "**", "**" + secs(b.AfterCrash) + "**", "**5 min**"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/recovery.md does not quote %s", want)
		}
	}
	if b.Backoff != 5*time.Minute {
		t.Errorf("the default longest backoff is %s; docs/recovery.md says 5 min", b.Backoff)
	}
}
