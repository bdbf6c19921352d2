// Package browsertest drives Debian's Chromium with chromedp for idemlab's
// browser tests: headless, sandbox off (tests run as root in CI), no
// background networking (the machine has no network), and a screenshot of
// the page whenever a test fails.
package browsertest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/testenv"
)

// ChromiumPath is where Debian's chromium package installs the browser;
// .ci/run installs it when it is missing. CHROMIUM overrides it.
const ChromiumPath = "/usr/bin/chromium"

// New starts a browser for this test and returns a context to run chromedp
// actions in. The browser is closed when the test ends; if the test failed,
// a full-page screenshot is saved first (see ScreenshotDir) and its path
// logged. A missing browser fails the test: a skipped browser test proves
// nothing.
func New(t testing.TB) context.Context {
	t.Helper()
	testenv.SkipIfShort(t, "starts Chromium")
	path := ChromiumPath
	if p := os.Getenv("CHROMIUM"); p != "" {
		path = p
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("browsertest: no Chromium at %s (apt-get install chromium, or run .ci/run): %v", path, err)
	}
	// Not t.TempDir: Chromium's helper processes may still write to the
	// profile for a moment after the browser exits, which fails t.TempDir's
	// strict removal. This directory is removed on a best-effort basis.
	profile, err := os.MkdirTemp("", "idemlab-chromium-")
	if err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900),
		// chromedp's default 20 s for the browser to start is too short on a
		// loaded machine.
		chromedp.WSURLReadTimeout(2*time.Minute),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tabCtx, cancelCtx := chromedp.NewContext(allocCtx)
	// Start the browser on tabCtx: the first Run ties the browser's life to
	// its context, so it must not be the one with the deadline below.
	if err := chromedp.Run(tabCtx); err != nil {
		cancelCtx()
		cancelAlloc()
		t.Fatalf("browsertest: start Chromium: %v", err)
	}
	// A bound for one test's browser work: generous, because on a loaded
	// machine a test's steps took over a minute together; a step waiting
	// for something that never appears still fails the test.
	ctx, cancelTimeout := context.WithTimeout(tabCtx, 5*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
		for range 20 {
			if os.RemoveAll(profile) == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	// Registered after the browser's cleanup, so it runs before it (LIFO).
	t.Cleanup(func() {
		if t.Failed() {
			// tabCtx, not ctx: ctx may be the deadline that failed the test.
			if p, err := Screenshot(tabCtx, t, "failure"); err == nil {
				t.Logf("browsertest: screenshot of the failing page: %s", p)
			} else {
				t.Logf("browsertest: no screenshot of the failing page: %v", err)
			}
		}
	})
	return ctx
}

// ScreenshotDir is where screenshots go: $SCREENSHOT_DIR, or a folder in
// the system temp directory.
func ScreenshotDir() string {
	if d := os.Getenv("SCREENSHOT_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "idemlab-screenshots")
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Screenshot saves a full-page PNG of the current page as
// <ScreenshotDir>/<test name>-<label>.png and returns its path.
func Screenshot(ctx context.Context, t testing.TB, label string) (string, error) {
	var png []byte
	shotCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// quality 100 makes chromedp capture a lossless PNG
	if err := chromedp.Run(shotCtx, chromedp.FullScreenshot(&png, 100)); err != nil {
		return "", err
	}
	dir := ScreenshotDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, unsafeName.ReplaceAllString(t.Name()+"-"+label, "_")+".png")
	return p, os.WriteFile(p, png, 0o644)
}

// Run runs actions one at a time, as chromedp.Run does, except that an
// action that fails because its node was replaced between chromedp's query
// and the action itself ("No node with given id found": htmx swapped the
// region) is run again, and its query finds the new node. On a loaded
// machine that window is wide. The failed attempt did nothing (the error
// comes before any input is sent), so a retried click clicks once.
func Run(ctx context.Context, actions ...chromedp.Action) error {
	for _, a := range actions {
		var err error
		for range 5 {
			err = chromedp.Run(ctx, a)
			if err == nil || !nodeSwapped(err) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// nodeSwapped reports whether err is Chromium saying the node an action held
// is gone: htmx replaced it between the query and the action. It says so in
// two ways, depending on the call.
func nodeSwapped(err error) bool {
	return strings.Contains(err.Error(), "No node with given id found") ||
		strings.Contains(err.Error(), "Could not find node with given id")
}
