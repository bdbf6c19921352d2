// Package crash makes a process die at a named point of a workflow, on
// purpose, so that what is durable at that moment — and who finishes the
// work — can be seen in a lab, a test or a chaos run.
//
// Packages name their own points (policies.CrashPoints, the relay's, the
// consumers') and pass them with Switch.At; the switch is armed from the
// environment at start (CRASH_AT, CRASH_MODE) or by an admin at run time
// (PUT /api/v1/admin/crash). An unarmed switch costs one atomic load.
package crash

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Point names a moment in a workflow where a process can die.
type Point string

// Mode is what firing does.
type Mode string

const (
	// Exit kills the whole process with SIGKILL: no deferred code, no
	// graceful shutdown, exactly like a machine losing power mid-request.
	Exit Mode = "exit"
	// Abandon ends only the current request — the connection is cut and
	// nothing more is written — so a browser demo can show a crash without
	// taking the server down. Outside a request it behaves like a panic.
	Abandon Mode = "abandon"
)

// Setting is the JSON of GET and PUT /api/v1/admin/crash.
type Setting struct {
	At   Point `json:"at"`   // "" = never
	Mode Mode  `json:"mode"` // exit or abandon
	Once bool  `json:"once"` // fire at the next matching pass only
}

// Switch decides whether the process dies at a point. It is safe for
// concurrent use.
type Switch struct {
	known  []Point
	logger *slog.Logger
	armed  atomic.Bool // set.At != "": the one thing a pass reads when nothing is armed

	mu  sync.Mutex
	set Setting
}

// New returns an unarmed switch that accepts the known points.
func New(known []Point, logger *slog.Logger) *Switch {
	return &Switch{known: slices.Clone(known), logger: logger, set: Setting{Mode: Exit}}
}

// Known lists the points the switch accepts, in the order given to New.
func (s *Switch) Known() []Point { return slices.Clone(s.known) }

// Validate checks a setting without arming it. The error is fit for people.
func (s *Switch) Validate(set Setting) error {
	if set.At != "" && !slices.Contains(s.known, set.At) {
		names := make([]string, len(s.known))
		for i, p := range s.known {
			names[i] = string(p)
		}
		return fmt.Errorf("%q is not a crash point (known: %s)", set.At, strings.Join(names, ", "))
	}
	if set.Mode != Exit && set.Mode != Abandon {
		return fmt.Errorf("mode %q is neither exit nor abandon", set.Mode)
	}
	return nil
}

// Arm sets the point, mode and once flag ({At: ""} disarms). An empty mode
// means Exit.
func (s *Switch) Arm(set Setting) error {
	if set.Mode == "" {
		set.Mode = Exit
	}
	if err := s.Validate(set); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set = set
	s.armed.Store(set.At != "")
	return nil
}

// Armed reports whether a point is armed. A nil switch never is.
func (s *Switch) Armed() bool { return s != nil && s.armed.Load() }

// Setting returns what is armed now.
func (s *Switch) Setting() Setting {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set
}

// At kills the process (or abandons the request) when p is armed. A nil
// switch never fires, so workflows call it unconditionally.
func (s *Switch) At(ctx context.Context, p Point) {
	if !s.Armed() {
		return
	}
	s.mu.Lock()
	fire := s.set.At != "" && s.set.At == p
	mode := s.set.Mode
	if fire && s.set.Once {
		s.set.At = ""
		s.armed.Store(false)
	}
	s.mu.Unlock()
	if !fire {
		return
	}
	if mode == Abandon {
		s.logger.WarnContext(ctx, "crash point: abandoning the request", "at", p)
		panic(http.ErrAbortHandler) // net/http cuts the connection; nothing more is written
	}
	s.logger.WarnContext(ctx, "crash point: killing the process", "at", p)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never reached: SIGKILL cannot be caught
}
