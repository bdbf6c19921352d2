// Package browsertest drives Debian's Chromium with chromedp for idemlab's
// browser tests: headless, sandbox off (tests run as root in CI), no
// background networking (the machine has no network), and a screenshot of
// the page whenever a test fails.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/testenv"
)

// ChromiumPath is where Debian's chromium package installs the browser;
// .ci/run installs it when it is missing. CHROMIUM overrides it.
const ChromiumPath = "/usr/bin/chromium"

// New opens a tab for this test in a browser context of its own — cookies,
// storage and cache as in a fresh browser, and nothing shared with another
// test — and returns a context to run chromedp actions in. The tab and its
// browser context close when the test ends; if the test failed, a full-page
// screenshot is saved first (see ScreenshotDir) and its path logged. A
// missing browser fails the test: a skipped browser test proves nothing.
//
// The Chromium process itself is shared by the tests of one binary (started
// by the first, again if it died): a browser context is as isolated as a new
// browser, and starting one costs a few milliseconds where starting Chromium
// costs a second or two of CPU — for each of the suite's browser tests.
func New(t testing.TB) context.Context {
	t.Helper()
	testenv.SkipIfShort(t, "starts Chromium")
	browserCtx, err := shared.get()
	if err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	// The browser context and its first tab are made here, not with
	// chromedp.WithNewBrowserContext: a new context has no window yet, and
	// Chromium opens a tab in one only when asked for a new window.
	browserCDP := cdp.WithExecutor(browserCtx, chromedp.FromContext(browserCtx).Browser)
	contextID, err := target.CreateBrowserContext().Do(browserCDP)
	if err != nil {
		t.Fatalf("browsertest: new browser context: %v", err)
	}
	tabID, err := target.CreateTarget("about:blank").WithBrowserContextID(contextID).WithNewWindow(true).Do(browserCDP)
	if err != nil {
		t.Fatalf("browsertest: open a tab: %v", err)
	}
	tabCtx, cancelTab := chromedp.NewContext(browserCtx, chromedp.WithTargetID(tabID))
	closeTab := func() {
		cancelTab() // detaches from the tab and closes it
		target.DisposeBrowserContext(contextID).Do(browserCDP)
	}
	if err := chromedp.Run(tabCtx); err != nil {
		closeTab()
		t.Fatalf("browsertest: attach to the tab: %v", err)
	}
	// A bound for one test's browser work: generous, because on a loaded
	// machine a test's steps took over a minute together; a step waiting
	// for something that never appears still fails the test.
	ctx, cancelTimeout := context.WithTimeout(tabCtx, 5*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		closeTab()
	})
	// Registered after the tab's cleanup, so it runs before it (LIFO).
	t.Cleanup(func() {
		if t.Failed() {
			// tabCtx, not ctx: ctx may be the deadline that failed the test.
			if p, err := capture(tabCtx, t, "failure"); err == nil {
				t.Logf("browsertest: screenshot of the failing page: %s", p)
			} else {
				t.Logf("browsertest: no screenshot of the failing page: %v", err)
			}
		}
	})
	return ctx
}

// shared is the test binary's Chromium.
var shared browser

type browser struct {
	mu  sync.Mutex
	ctx context.Context // done when the browser has gone
}

// get returns the running browser's context, starting Chromium when none
// runs (the first test, or after a crash). The browser lives until the test
// binary exits: chromedp starts it with a parent-death signal, so it dies
// with the binary, and its profile folder is named by the binary's pid so
// that the next binary removes what this one leaves.
func (b *browser) get() (context.Context, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx != nil && b.ctx.Err() == nil {
		return b.ctx, nil
	}
	path := ChromiumPath
	if p := os.Getenv("CHROMIUM"); p != "" {
		path = p
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no Chromium at %s (apt-get install chromium, or run scripts/test-deps.sh): %w", path, err)
	}
	removeDeadProfiles()
	profile := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d", profilePrefix, os.Getpid()))
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
	ctx, cancel := chromedp.NewContext(allocCtx)
	// The first Run starts the browser and ties its life to ctx, which is
	// never cancelled: the browser outlives every test's tab.
	if err := chromedp.Run(ctx); err != nil {
		cancel()
		cancelAlloc()
		return nil, fmt.Errorf("start Chromium: %w", err)
	}
	b.ctx = ctx
	return ctx, nil
}

const profilePrefix = "idemlab-browser-pid"

// removeDeadProfiles removes the profile folders of test binaries that have
// exited (their pid is gone).
func removeDeadProfiles() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), profilePrefix+"*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), profilePrefix))
		if err != nil || syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(d)
		}
	}
}

// ScreenshotDir is where screenshots go: $SCREENSHOT_DIR, or a folder in
// the system temp directory (a failing test's page, when it is unset).
func ScreenshotDir() string {
	if d := os.Getenv("SCREENSHOT_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "idemlab-screenshots")
}

// SavingScreenshots reports whether the tests' pictures of their pages are
// wanted: SCREENSHOT_DIR is set. They are for a person to look at and
// assert nothing, and each costs Chromium about a quarter of a CPU-second
// (150 of them were a tenth of make test), so a run that nobody looks at
// takes none; a failing test's page is saved either way.
func SavingScreenshots() bool { return os.Getenv("SCREENSHOT_DIR") != "" }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Screenshot saves a full-page PNG of the current page as
// <ScreenshotDir>/<test name>-<label>.png and logs its path, when
// SavingScreenshots; otherwise it does nothing.
func Screenshot(ctx context.Context, t testing.TB, label string) error {
	if !SavingScreenshots() {
		return nil
	}
	p, err := capture(ctx, t, label)
	if err == nil {
		t.Logf("screenshot: %s", p)
	}
	return err
}

// capture saves a full-page PNG of the current page as
// <ScreenshotDir>/<test name>-<label>.png and returns its path.
func capture(ctx context.Context, t testing.TB, label string) (string, error) {
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
