package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// AppBinary builds the app (./cmd/web) the way the Dockerfile does —
// CGO_ENABLED=0 go build -trimpath -ldflags="-s -w", the command
// TestDockerfileBuildCommand holds the Dockerfile to — into a folder of t's
// and returns the binary's path: the tests that run the app as a process of
// its own run what ships.
//
// One build at a time on this machine (LockBuild): make test starts the
// tests that build the app together, and two builds of the same packages at
// once compile everything twice — about 170 CPU-seconds each on a cold
// cache. One after the other, the second is a link from Go's build cache.
func AppBinary(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "builds the app with go build")
	bin := filepath.Join(t.TempDir(), "web")
	defer LockBuild(t)()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/idemlab/idemlab/cmd/web")
	cmd.Env = BuildEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: go build ./cmd/web: %v\n%s", err, out)
	}
	return bin
}

// BuildEnv is the environment of a build as the Dockerfile runs it: no cgo,
// and no VCS stamp (the image's build context has no .git).
func BuildEnv() []string {
	return append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS="+os.Getenv("GOFLAGS")+" -buildvcs=false")
}

// LockBuild waits until no other test process on this machine is building
// the app, holds that until the returned function is called, and returns it.
// The lock is a file in the temporary folder, released by the kernel when
// its holder dies.
func LockBuild(t testing.TB) (unlock func()) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "idemlab-app-build.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("testenv: build lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("testenv: build lock: %v", err)
	}
	return func() { f.Close() }
}
