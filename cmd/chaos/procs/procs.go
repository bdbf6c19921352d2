// Package procs runs the system under test as real operating-system
// processes — `web serve` twice, `web provider`, the other fakes — built
// from the current tree, so the nemesis can do to them what a machine does:
// SIGKILL with no warning, SIGSTOP for seconds, start again.
//
// Each process is supervised: when it exits, however it exits, the
// supervisor says why (killed by the nemesis, died at a crash point, or
// ended on its own — the last is always a finding) and starts it again,
// after the down time the killer asked for.
package procs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles ./cmd/web of the module at root into dir and returns the
// binary's path: the chaos run tests exactly the tree it is run from.
func Build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "web")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/web")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("procs: go build ./cmd/web: %w\n%s", err, out)
	}
	return bin, nil
}

// ModuleRoot is the folder of the go.mod the tool runs in.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("procs: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("procs: not inside a Go module: run from the repository")
	}
	return filepath.Dir(gomod), nil
}

// FreeAddr returns a free 127.0.0.1 address for a process to listen on.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Spec says how to run one process.
type Spec struct {
	Name      string   // app-1, provider, …: names it in logs and the report
	Bin       string   // the web binary
	Args      []string // serve, provider, …
	Env       []string // KEY=value, on top of a minimal environment
	Addr      string   // where it listens (the readiness probe goes there)
	ReadyPath string   // a GET answering 2xx once it serves, e.g. /healthz; "" for a server that is not HTTP: ready once it accepts a connection
	LogPath   string   // stdout and stderr of every run, appended
}

// Why a process exited.
const (
	ByNemesis = "killed"      // the nemesis sent SIGKILL
	ByCrash   = "crash-point" // it killed itself at an armed crash point
	OnItsOwn  = "on-its-own"  // nobody asked: a finding
	ByStop    = "stopped"     // the end of the run
	ByRestart = "restarted"   // restarted on purpose to change its environment
)

// Exit describes one ended run of a process.
type Exit struct {
	Name    string
	Reason  string // ByNemesis, ByCrash, OnItsOwn, ByStop
	Status  string // "signal: killed", "exit status 1"
	LogTail string // the run's last log lines (for OnItsOwn)
	At      time.Time
	// Point is the crash point named in the log (ByCrash).
	Point string
}

// Process is one supervised process.
type Process struct {
	spec   Spec
	onExit func(Exit)

	mu       sync.Mutex
	cmd      *exec.Cmd
	started  time.Time
	logStart int64  // log size when this run began: its own lines follow
	killed   string // "": nobody killed this run; else ByNemesis or ByRestart
	downFor  time.Duration
	paused   bool
	nextEnv  []string // extra environment for the next run only
	extraEnv []string // extra environment for every later run
	stopping bool
	runs     int
	up       chan struct{} // closed while a run is serving (ready)
	stopped  chan struct{}
}

// Start runs the process under supervision; onExit hears about every exit.
// It returns once the first run serves.
func Start(ctx context.Context, spec Spec, onExit func(Exit)) (*Process, error) {
	p := &Process{spec: spec, onExit: onExit, stopped: make(chan struct{}), up: make(chan struct{})}
	first := make(chan error, 1)
	go p.supervise(first)
	select {
	case err := <-first:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		return nil, fmt.Errorf("procs: %s never served: %w; its log ends:\n%s", spec.Name, err, p.logTail(0, 2000))
	}
	return p, nil
}

// Name is the process's name.
func (p *Process) Name() string { return p.spec.Name }

// URL is where it listens, as http://.
func (p *Process) URL() string { return "http://" + p.spec.Addr }

// Runs counts how many times it has been started.
func (p *Process) Runs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs
}

// supervise starts the process, waits for it to exit, reports why, and
// starts it again, until Stop.
func (p *Process) supervise(first chan<- error) {
	defer close(p.stopped)
	for {
		cmd, err := p.startRun()
		if first != nil {
			first <- err
			first = nil
			if err != nil {
				return
			}
		} else if err != nil {
			time.Sleep(time.Second)
			continue
		}
		go p.markReady(cmd, p.upChannel())
		waitErr := cmd.Wait()
		ex := p.exitOf(waitErr)
		if p.onExit != nil {
			p.onExit(ex)
		}
		p.mu.Lock()
		stopping, down := p.stopping, p.downFor
		p.cmd, p.killed, p.paused, p.downFor = nil, "", false, 0
		p.up = make(chan struct{})
		p.mu.Unlock()
		if stopping {
			return
		}
		if ex.Reason != ByNemesis && ex.Reason != ByRestart {
			down = 500 * time.Millisecond // a crash or an exit: come back soon
		}
		time.Sleep(down)
	}
}

func (p *Process) startRun() (*exec.Cmd, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("procs: %s: log: %w", p.spec.Name, err)
	}
	defer logf.Close()
	fi, _ := logf.Stat()
	fmt.Fprintf(logf, "=== chaos: %s run %d starts at %s\n", p.spec.Name, p.runs+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.spec.Bin, p.spec.Args...)
	cmd.Env = append(append(append(baseEnv(), p.spec.Env...), p.extraEnv...), p.nextEnv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a Ctrl-C meant for the tool does not reach
	// it first; and it dies with the tool.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("procs: start %s: %w", p.spec.Name, err)
	}
	p.cmd, p.started, p.nextEnv = cmd, time.Now(), nil
	p.logStart = fi.Size()
	p.runs++
	return cmd, nil
}

// upChannel is the channel the current run closes once it serves.
func (p *Process) upChannel() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

// markReady closes the run's up channel once it answers its readiness
// probe. A kill gives the process a fresh channel at once, so a probe the
// dying run still answers closes only its own, stale one.
func (p *Process) markReady(cmd *exec.Cmd, up chan struct{}) {
	client := &http.Client{Timeout: time.Second}
	for {
		p.mu.Lock()
		current := p.cmd == cmd && p.killed == ""
		p.mu.Unlock()
		if !current {
			return
		}
		if p.spec.ReadyPath == "" { // not HTTP (a Kafka broker): accepting connections is serving
			if conn, err := net.DialTimeout("tcp", p.spec.Addr, time.Second); err == nil {
				conn.Close()
				close(up)
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		resp, err := client.Get(p.URL() + p.spec.ReadyPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				close(up)
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitReady waits until the current run serves.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		select {
		case <-up:
			p.mu.Lock()
			same := p.up == up
			p.mu.Unlock()
			if same {
				return nil
			}
		case <-time.After(100 * time.Millisecond): // a new run replaced the channel
		case <-deadline:
			return fmt.Errorf("not serving after %s", timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Serving reports whether the current run answers (and is not paused).
func (p *Process) Serving() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.paused {
		return false
	}
	select {
	case <-p.up:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL now; the supervisor starts the process again after
// downFor. nextEnv, if any, is added to the next run's environment only
// (CRASH_AT=… to make it die at a crash point). It reports false when no
// run was there to kill.
func (p *Process) Kill(downFor time.Duration, nextEnv ...string) bool {
	return p.kill(ByNemesis, downFor, nextEnv)
}

// Restart is Kill for a reason other than a fault: the process must start
// again with a changed environment (SetEnv). Its exit says ByRestart.
func (p *Process) Restart(downFor time.Duration) bool {
	return p.kill(ByRestart, downFor, nil)
}

func (p *Process) kill(reason string, downFor time.Duration, nextEnv []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.killed != "" {
		return false
	}
	p.killed, p.downFor, p.nextEnv = reason, downFor, nextEnv
	p.up = make(chan struct{}) // not serving from now: WaitReady waits for the next run
	p.cmd.Process.Signal(syscall.SIGKILL)
	return true
}

// SetEnv adds environment to every later run (PROVIDER_IDEMPOTENT_CALLS
// when the app cannot be told at run time). Later values win.
func (p *Process) SetEnv(env ...string) {
	p.mu.Lock()
	p.extraEnv = append(p.extraEnv, env...)
	p.mu.Unlock()
}

// Pause sends SIGSTOP: the process keeps its sockets and its leases and
// does nothing — a long GC pause, a stalled VM. Resume undoes it.
func (p *Process) Pause() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.paused || p.killed != "" {
		return false
	}
	p.paused = true
	p.cmd.Process.Signal(syscall.SIGSTOP)
	// kill(2) only queues the stop: every thread stops when it next reaches
	// the kernel, which on a busy machine may be after a request was already
	// answered. Pause returns once the process is really stopped, so a fault
	// the nemesis records as "paused" is one.
	waitStopped(p.cmd.Process.Pid, time.Second)
	return true
}

// waitStopped waits, up to limit, until /proc says pid is stopped ('T').
func waitStopped(pid int, limit time.Duration) {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(time.Millisecond) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // gone, or no /proc here: nothing to wait for
		}
		// "pid (comm) state …": comm may hold spaces and parentheses.
		if i := bytes.LastIndexByte(raw, ')'); i >= 0 && i+2 < len(raw) && raw[i+2] == 'T' {
			return
		}
	}
}

// Resume sends SIGCONT to a paused run.
func (p *Process) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.paused {
		p.paused = false
		p.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Stop ends the process for good: SIGTERM, then SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	cmd := p.cmd
	if cmd != nil {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Signal(syscall.SIGTERM)
	}
	p.mu.Unlock()
	select {
	case <-p.stopped:
	case <-time.After(grace):
		p.mu.Lock()
		if p.cmd != nil {
			p.cmd.Process.Signal(syscall.SIGKILL)
		}
		p.mu.Unlock()
		<-p.stopped
	}
}

// exitOf classifies the run that just ended.
func (p *Process) exitOf(waitErr error) Exit {
	p.mu.Lock()
	killed, stopping, from := p.killed, p.stopping, p.logStart
	p.mu.Unlock()
	ex := Exit{Name: p.spec.Name, At: time.Now(), Status: "exit status 0"}
	if waitErr != nil {
		ex.Status = waitErr.Error()
	}
	tail := p.logTail(from, 4000)
	switch {
	case killed != "":
		ex.Reason = killed
	case stopping:
		ex.Reason = ByStop
	case strings.Contains(ex.Status, "signal: killed") && strings.Contains(tail, "crash point: killing the process"):
		ex.Reason, ex.Point = ByCrash, crashPoint(tail)
	default:
		ex.Reason, ex.LogTail = OnItsOwn, lastLines(tail, 8)
	}
	return ex
}

// logTail reads the log from offset from, at most n bytes from its end.
func (p *Process) logTail(from int64, n int64) string {
	f, err := os.Open(p.spec.LogPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, _ := f.Stat()
	start := max(from, fi.Size()-n)
	f.Seek(start, io.SeekStart)
	b, _ := io.ReadAll(f)
	return string(b)
}

// crashPoint finds the point on the log's crash line: "at" in a JSON log
// line (LOG_FORMAT=json), at=… in a text one.
func crashPoint(log string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	point := ""
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "crash point: killing the process") {
			continue
		}
		var v struct {
			At string `json:"at"`
		}
		if json.Unmarshal([]byte(line), &v) == nil && v.At != "" {
			point = v.At
		} else if _, after, ok := strings.Cut(line, " at="); ok {
			point, _, _ = strings.Cut(after, " ")
		}
	}
	return point
}

func lastLines(s string, n int) string {
	lines := bytes.Split(bytes.TrimRight([]byte(s), "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// baseEnv is what every process inherits: enough to run, nothing of the
// tool's own configuration (a DATABASE_URL in the shell must not leak in).
func baseEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "TZ", "LANG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
