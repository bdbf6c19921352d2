// Package testenv is what the tests need from the machine, provided by the
// tests themselves where a library allows: the short tier's skips and a
// NATS server with JetStream.
//
// The two tiers (docs/testing.md): `make test-short` (go test -short) runs
// every test that needs nothing slower than PostgreSQL and in-process
// servers, in about a minute; `make test` runs everything — browsers, the
// chaos soak, child processes, database restarts. Developers run the short
// tier while working; CI runs the full one.
package testenv

import (
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/events"
)

// SkipIfShort skips t under -short, saying in one line why it belongs to
// the full tier ("starts Chromium", "restarts PostgreSQL").
func SkipIfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: " + why)
	}
}

// DefaultNATSURL is where the machine's NATS server listens, if it has one.
const DefaultNATSURL = "nats://127.0.0.1:4222"

var (
	natsOnce sync.Once
	natsURL  string
	natsErr  error
	natsSrv  *events.NATSServer // the embedded one, when started
)

// NATSURL is the JetStream server the tests of this binary share (each
// test names its own stream and subjects): NATS_URL when set, else the
// machine's at DefaultNATSURL when it answers, else an embedded server
// (events.NATSServer) started once for this test binary. Nothing to install.
func NATSURL(t testing.TB) string {
	t.Helper()
	natsOnce.Do(func() {
		if natsURL = os.Getenv("NATS_URL"); natsURL != "" {
			return
		}
		if c, err := net.DialTimeout("tcp", "127.0.0.1:4222", time.Second); err == nil {
			c.Close()
			natsURL = DefaultNATSURL
			return
		}
		// It serves every test of this binary: StopNATS, in TestMain, ends it.
		natsSrv, natsErr = events.StartNATSServer(events.NATSServerConfig{Addr: "127.0.0.1:0"})
		if natsErr == nil {
			natsURL = natsSrv.URL()
		}
	})
	if natsErr != nil {
		t.Fatalf("testenv: no NATS at NATS_URL or %s, and the embedded one did not start: %v", DefaultNATSURL, natsErr)
	}
	return natsURL
}

// StopNATS stops the embedded server NATSURL started, if it did, and
// removes its store; a package's TestMain calls it after m.Run.
func StopNATS() {
	if natsSrv != nil {
		natsSrv.Close()
	}
}
