package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"syscall"

	"github.com/idemlab/idemlab/internal/policies"
)

// Crash modes.
const (
	// crashExit kills the whole process with SIGKILL: no deferred code, no
	// graceful shutdown, exactly like a machine losing power mid-request.
	crashExit = "exit"
	// crashAbandon ends only the current request — the connection is cut
	// and nothing more is written — so a browser demo can show a crash
	// without taking the server down.
	crashAbandon = "abandon"
)

func validateCrash(at, mode string) error {
	if at != "" {
		found := false
		for _, p := range policies.CrashPoints {
			found = found || string(p) == at
		}
		if !found {
			return fmt.Errorf("CRASH_AT: %q is not after_claim, after_provider_call or after_commit", at)
		}
	}
	if mode != crashExit && mode != crashAbandon {
		return fmt.Errorf("CRASH_MODE: %q is neither exit nor abandon", mode)
	}
	return nil
}

// crashSwitch decides whether the cancellation dies at a crash point. It is
// set from the environment at start and by an admin at run time.
type crashSwitch struct {
	mu   sync.Mutex
	at   policies.CrashPoint
	mode string
	once bool // clear after firing once
}

// crashSetting is the JSON of GET/PUT /api/v1/admin/crash.
type crashSetting struct {
	At   string `json:"at"`   // "" = never
	Mode string `json:"mode"` // exit or abandon
	Once bool   `json:"once"` // fire at the next matching request only
}

func (cs *crashSwitch) get() crashSetting {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return crashSetting{At: string(cs.at), Mode: cs.mode, Once: cs.once}
}

func (cs *crashSwitch) set(s crashSetting) error {
	if s.Mode == "" {
		s.Mode = crashExit
	}
	if err := validateCrash(s.At, s.Mode); err != nil {
		return err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.at, cs.mode, cs.once = policies.CrashPoint(s.At), s.Mode, s.Once
	return nil
}

// hook is the Canceller's Crash function.
func (cs *crashSwitch) hook(logger interface{ Warn(string, ...any) }) func(context.Context, policies.CrashPoint) {
	return func(ctx context.Context, at policies.CrashPoint) {
		cs.mu.Lock()
		fire := cs.at != "" && cs.at == at
		mode := cs.mode
		if fire && cs.once {
			cs.at = ""
		}
		cs.mu.Unlock()
		if !fire {
			return
		}
		if mode == crashAbandon {
			logFrom(ctx).Warn("crash point: abandoning the request", "at", at)
			panic(http.ErrAbortHandler) // net/http cuts the connection; nothing more is written
		}
		logger.Warn("crash point: killing the process", "at", at)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never reached: SIGKILL cannot be caught
	}
}
